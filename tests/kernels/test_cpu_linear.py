"""The bf16 matrix-vector kernel for small decode batches against an fp32 matmul."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.cpu_extension import SMALL_BATCH_ROWS, cpu_kernels, small_batch_linear_kernels

pytestmark = pytest.mark.skipif(
    cpu_kernels() is None or not cpu_kernels().linear_small_batch_available(),
    reason="needs a CPU (and compiler) with AVX512-BF16",
)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.mark.parametrize("rows", range(1, SMALL_BATCH_ROWS + 1))
@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (7, 64), (130, 4864)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_an_fp32_matmul(rows, out_features, in_features, with_bias):
    x, weight = randn(rows, in_features), randn(out_features, in_features, seed=1)
    bias = randn(out_features, seed=2) if with_bias else None
    assert small_batch_linear_kernels(x, weight) is not None
    actual = kernels.linear(x, weight, bias)
    expected = torch.nn.functional.linear(
        x.float(), weight.float(), None if bias is None else bias.float()
    )
    assert actual.dtype == torch.bfloat16 and actual.shape == (rows, out_features)
    # fp32 accumulation either way; the difference is the bf16 rounding of the result
    # (and of the sum before the bias): within 2 ulps of bf16 (2^-7 relative).
    scale = expected.abs().clamp_min(1.0)
    assert ((actual.float() - expected).abs() / scale).max() < 2 * 2**-7


def test_serves_only_small_bf16_batches():
    weight = randn(64, 64)
    assert small_batch_linear_kernels(randn(SMALL_BATCH_ROWS + 1, 64), weight) is None
    assert small_batch_linear_kernels(randn(1, 64).float(), weight.float()) is None
    assert small_batch_linear_kernels(randn(1, 48), randn(64, 48)) is None  # 48 % 32 != 0
    # Larger batches fall through to oneDNN on packed weights, the same answer as torch's.
    x = randn(9, 64)
    assert torch.equal(kernels.linear(x, weight), torch.nn.functional.linear(x, weight))
