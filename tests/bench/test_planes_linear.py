"""bench/planes_linear.py without a GPU: a case's figures on CPU tensors in Triton's
interpreter (the timer replaced), and the refusal without a GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from bench import kernels, planes_linear  # noqa: E402


@pytest.mark.parametrize("qtype", planes_linear.QTYPES)
def test_a_case_reports_times_the_bound_and_the_error(qtype, monkeypatch):
    monkeypatch.setattr(kernels, "timed", lambda fn, *args: 0.5)  # ms
    weight = kernels.timing_weight(qtype, 40, 512, torch.device("cpu"))
    dense = weight.dequantize(torch.bfloat16)
    row = planes_linear.bench_case(weight, 2, dense, peak=1000.0)
    assert (row["qtype"], row["n"], row["k"], row["m"]) == (qtype, 40, 512, 2)
    assert row["planes_us"] == row["file_blocks_us"] == row["torch_bf16_us"] == 500.0
    # the planes (padded rows) and x and y in bf16, at 1000 GB/s
    assert row["bytes"] >= 40 * 512 // 2 + (2 * 512 + 2 * 40) * 2
    assert row["hbm_bound_us"] == pytest.approx(row["bytes"] / 1e6)
    assert row["max_relative_error"] < 1e-2 and "gemv" in row["tiles"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_refuses(capsys):
    assert planes_linear.main([]) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err
