"""bench.ab_revisions: the child's workloads on the real engine, and the interval it
reports around the median of the rounds' ratios."""

from __future__ import annotations

import statistics

from bench import amx
from bench.ab_revisions import ALL_WORKLOADS, AMX_WORKLOADS, measure, median_interval


def test_the_child_measures_each_workload_on_the_embedded_model(monkeypatch):
    # bench.amx's workloads as it builds them, made small: 2 requests of a few tokens.
    for name in AMX_WORKLOADS:
        _, _, _, sampled = amx.WORKLOADS[name]
        monkeypatch.setitem(amx.WORKLOADS, name, (2, (24, 40), 3, sampled))
    rates = measure(repeats=1, batch=2, output_len=3, workloads=ALL_WORKLOADS)
    assert set(rates) == set(ALL_WORKLOADS)
    assert all(rate > 0 for rate in rates.values())


def test_the_interval_holds_the_median_and_narrows_with_rounds():
    ratios = [0.9, 1.1, 0.95, 1.05, 1.0, 0.98, 1.02]
    low, high = median_interval(ratios)
    assert low <= statistics.median(ratios) <= high
    assert median_interval([1.0] * 7) == (1.0, 1.0)
    wide = median_interval([0.5, 1.5, 0.6, 1.4])
    assert wide[1] - wide[0] > high - low


def test_each_measured_run_computes_its_prompts(monkeypatch):
    # The first run of a workload (unmeasured) leaves its prompts' blocks in the prefix
    # cache: a measured run that found them there would time no prefill.
    monkeypatch.setitem(amx.WORKLOADS, "prefill", (2, (40, 40), 1, False))
    hits = []
    timed_run = amx.timed_run

    def counted(engine, work):
        before = engine.memory_stats()["prefix_cache_hits"]
        result = timed_run(engine, work)
        hits.append(engine.memory_stats()["prefix_cache_hits"] - before)
        return result

    monkeypatch.setattr(amx, "timed_run", counted)
    measure(repeats=2, batch=2, output_len=3, workloads=("prefill",))
    assert hits == [0, 0, 0]  # the unmeasured run, then two measured ones
