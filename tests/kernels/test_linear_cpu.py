"""bf16 linear layers on packed weights (our kernel or oneDNN), against torch's F.linear."""

from __future__ import annotations

import pytest
import torch
from hetero_infer import kernels
from hetero_infer.kernels.linear_cpu import packed_linear, packed_linear_serves

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.mark.parametrize("rows", [1, 5, 64, 300])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("out_features", [200, 224])  # oneDNN's, and our kernel's where built
def test_matches_torch_linear(rows, with_bias, out_features):
    x, weight = randn(rows, 96), randn(out_features, 96, seed=1)
    bias = randn(out_features, seed=2) if with_bias else None
    expected = torch.nn.functional.linear(
        x.float(), weight.float(), None if bias is None else bias.float()
    )
    actual = packed_linear(x, weight, bias)
    assert actual.dtype == torch.bfloat16 and actual.shape == (rows, out_features)
    scale = expected.abs().clamp_min(1.0)
    assert ((actual.float() - expected).abs() / scale).max() < 2 * 2**-7


def test_keeps_leading_dims():
    x, weight = randn(3, 7, 64), randn(32, 64, seed=1)
    assert packed_linear(x, weight).shape == (3, 7, 32)


@pytest.mark.parametrize("out_features", [30, 32])
def test_repacks_a_weight_changed_in_place(out_features):
    x, weight = randn(8, 64), randn(out_features, 64, seed=1)
    before = packed_linear(x, weight)
    with torch.no_grad():
        weight.mul_(2)
    after = packed_linear(x, weight)
    assert torch.equal(after, 2 * before)  # a power of two scales exactly


def test_serves_bf16_cpu_only_and_kernels_linear_uses_it():
    weight = randn(32, 64)
    assert packed_linear_serves(randn(9, 64), weight)
    assert not packed_linear_serves(randn(9, 64).float(), weight.float())
    x = randn(9, 64)
    assert torch.equal(kernels.linear(x, weight), packed_linear(x, weight))
