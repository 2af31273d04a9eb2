"""bench/prefill_attention.py: its chunk list, and one short real run of both parts."""

from __future__ import annotations

import json

import pytest
from hetero_infer.kernels import paged_attention_cpu
from hetero_infer.kernels.cpu_extension import load_cpu_kernels

from bench.prefill_attention import main, parse_chunks


def test_chunks_are_cached_plus_new_tokens():
    assert parse_chunks("0+512,2000+32") == [(0, 512), (2000, 32)]
    with pytest.raises(ValueError):
        parse_chunks("512")


def test_one_round_times_both_ways_and_restores_the_threshold(tmp_path):
    if load_cpu_kernels() is None:
        pytest.skip("the C++ kernels did not build")
    before = paged_attention_cpu.MATMUL_FROM_PAIRS
    out = tmp_path / "result.json"
    main(["--rounds", "2", "--chunks", "0+40,100+8", "--prompts", "24", "--out", str(out)])
    assert before == paged_attention_cpu.MATMUL_FROM_PAIRS
    saved = json.loads(out.read_text())
    assert saved["machine"]["cpu"] and "threads" in saved["machine"]
    results = saved["results"]
    assert set(results["kernel"]) == {"0+40", "100+8"} and set(results["engine"]) == {"24"}
    for summary in [*results["kernel"].values(), *results["engine"].values()]:
        for system in ("rows", "matmul"):
            times = summary["ms"][system]["rounds"]
            assert len(times) == 2 and all(t > 0 for t in times)
        ratio = summary["ratio_rows_over_matmul"]
        assert ratio["min"] <= ratio["median"] <= ratio["max"]
