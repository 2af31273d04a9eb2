"""bench/planes_linear.py without a GPU: a case's figures on CPU tensors in Triton's
interpreter (the timer replaced), and the refusal without a GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from bench import kernels, planes_linear  # noqa: E402


@pytest.mark.parametrize("qtype", planes_linear.QTYPES)
def test_a_case_reports_times_the_bound_and_the_error(qtype, monkeypatch):
    monkeypatch.setattr(kernels, "timed", lambda fn, *args: 0.25)  # ms
    monkeypatch.setattr(kernels, "graph_timed", lambda calls: [c() for c in calls] and 0.5)
    weight = kernels.timing_weight(qtype, 40, 512, torch.device("cpu"))
    dense = weight.dequantize(torch.bfloat16)
    row = planes_linear.bench_case(weight, 2, dense, peak=1000.0)
    assert (row["qtype"], row["n"], row["k"], row["m"]) == (qtype, 40, 512, 2)
    assert row["planes_us"] == row["file_blocks_us"] == row["torch_bf16_us"] == 500.0
    assert row["planes_launched_us"] == 250.0
    # the planes (padded rows) and x and y in bf16, at 1000 GB/s
    assert row["bytes"] >= 40 * 512 // 2 + (2 * 512 + 2 * 40) * 2
    assert row["hbm_bound_us"] == pytest.approx(row["bytes"] / 1e6)
    assert row["max_relative_error"] < 1e-2 and "words" in row["tiles"]  # a word type


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_refuses(capsys):
    assert planes_linear.main([]) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


from hetero_infer.kernels.linear_planes_triton import PlanesTiles  # noqa: E402


def test_the_sweep_times_the_chosen_tiles_and_the_others_and_keeps_the_fastest(monkeypatch):
    times = iter(range(100, 0, -1))  # each later candidate faster: the last is the best
    monkeypatch.setattr(kernels, "graph_timed", lambda calls: [c() for c in calls] and next(times))
    weight = kernels.timing_weight("Q4_0", 40, 512, torch.device("cpu"))
    row = planes_linear.sweep_case(weight, 1, peak=1000.0)
    tiles = list(row["us_by_tiles"])
    assert tiles[0] == row["chosen"] and row["chosen_us"] == 100 * 1e3
    assert len(tiles) == len(set(tiles)) > 1  # each candidate once
    assert row["best"] == tiles[-1] and row["best_us"] == min(row["us_by_tiles"].values())
    # one row: both GEMVs' candidates, and the dot kernel's on rows padded to 16
    kernels_tried = {t.split("(")[1].split(",")[0] for t in tiles}
    assert kernels_tried == {"kernel='words'", "kernel='gemv'", "kernel='dot'"}
    words = planes_linear.candidate_tiles(1, "Q4_K", PlanesTiles("words", 1, 8, 3, 4, 1))
    assert {t.kernel for t in words} == {"words", "gemv"}
    assert {t.num_splits for t in words if t.kernel == "words"} == {1, 3}
    # a type the word GEMV would not take: the byte-wise GEMV's candidates alone
    gemv = planes_linear.candidate_tiles(1, "X", PlanesTiles("gemv", 1, 8, 3, 2, 3))
    assert {t.kernel for t in gemv} == {"gemv"}
    assert {t.unroll for t in gemv} == {4, 8, 16} and {t.num_splits for t in gemv} == {3}


def test_candidates_vary_the_split_and_keep_the_kernel():
    chosen = PlanesTiles("dot", 16, 64, 4, 4, 2)
    candidates = planes_linear.candidate_tiles(16, "Q4_0", chosen)
    assert {c.num_splits for c in candidates} == {1, 4, 8}
    assert {(c.kernel, c.block_m) for c in candidates} == {("dot", 16)}
