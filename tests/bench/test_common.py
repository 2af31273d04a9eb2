"""bench/common.py's summary of an A/B benchmark's interleaved rounds."""

from __future__ import annotations

from bench.common import ab_summary


def test_the_ratio_pairs_each_round_not_the_medians():
    rounds = {"a": [2.0, 3.0, 9.0], "b": [1.0, 3.0, 3.0]}
    summary = ab_summary(rounds, "a", "b", "tokens_per_second")
    ratio = summary["ratio_a_over_b"]
    assert ratio["rounds"] == [2.0, 1.0, 3.0]
    assert (ratio["median"], ratio["min"], ratio["max"]) == (2.0, 1.0, 3.0)
    # The medians' ratio would be 3.0 / 3.0: what ran under one round's load is compared.
    a = summary["tokens_per_second"]["a"]
    assert (a["median"], a["min"], a["max"], a["rounds"]) == (3.0, 2.0, 9.0, [2.0, 3.0, 9.0])
