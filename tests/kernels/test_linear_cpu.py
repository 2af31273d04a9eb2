"""bf16 linear layers on packed weights (our kernel or oneDNN), against torch's F.linear."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from hetero_infer.kernels import cpu_isa, linear_cpu, select_kernels
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.linear import TorchLinear
from hetero_infer.kernels.linear_cpu import WIDEN_ROWS, WidenedLinear, pack_linear

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)
# Where neither our bf16 kernel nor oneDNN's packs bf16 weights (oneDNN needs AVX-512 or
# AVX-NE-CONVERT), a bf16 weight is served by F.linear as it is (widened to fp32 from
# WIDEN_ROWS rows): nothing is packed.
kernels = load_cpu_kernels()
packs_bf16 = pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    and not (kernels is not None and kernels.linear_packed_available()),
    reason="neither our bf16 kernel nor oneDNN's packed bf16 runs on this CPU",
)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


def packed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ weight^T + bias on a copy of the weight packed for this call."""
    return pack_linear(weight, bias, load_cpu_kernels())(x)


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


@packs_bf16
@pytest.mark.parametrize("out_features", [30, 32])
def test_repacks_a_weight_changed_in_place(out_features):
    x, weight = randn(8, 64), randn(out_features, 64, seed=1)
    packed = pack_linear(weight, None, load_cpu_kernels())
    before = packed(x)
    with torch.no_grad():
        weight.mul_(2)
    # A packed copy is a snapshot of the weight: a change needs an explicit re-pack (the
    # engine packs once, after loading: DecoderForCausalLM.pack_weights).
    assert torch.equal(packed(x), before)
    after = pack_linear(weight, None, load_cpu_kernels())(x)
    assert torch.equal(after, 2 * before)  # a power of two scales exactly


@packs_bf16
def test_serves_bf16_cpu_only_and_the_engine_uses_it():
    weight = randn(32, 64)
    assert not isinstance(pack_linear(weight, None, load_cpu_kernels()), TorchLinear)
    assert isinstance(pack_linear(weight.float(), None, load_cpu_kernels()), TorchLinear)
    x = randn(9, 64)
    ops = select_kernels("auto", torch.device("cpu")).ops
    assert torch.equal(ops.pack_linear(weight, None)(x), packed_linear(x, weight))


def test_a_bf16_weight_no_kernel_takes_is_widened_from_16_rows(monkeypatch):
    """Where the CPU has no bf16 arithmetic and neither packed form takes a bf16 weight
    (40 outputs: not a multiple of our kernel's 32; oneDNN refused here), fewer than
    WIDEN_ROWS rows run torch's bf16 F.linear, more run it in fp32, rounded once."""
    monkeypatch.setattr(linear_cpu, "onednn_linear", lambda weight, bias: None)
    monkeypatch.setattr(cpu_isa, "has_bf16_matmul", lambda flags=None: False)
    weight, bias = randn(40, 64), randn(40, seed=1)
    linear = pack_linear(weight, bias, kernels)
    assert isinstance(linear, WidenedLinear)
    torch_linear, computed_in = F.linear, []

    def spied(x, w, b=None):
        computed_in.append(x.dtype)
        return torch_linear(x, w, b)

    monkeypatch.setattr(F, "linear", spied)
    few = randn(WIDEN_ROWS - 1, 64, seed=2)
    assert torch.equal(linear(few), torch_linear(few, weight, bias))
    many = randn(2, WIDEN_ROWS // 2, 64, seed=3)  # rows over leading dims
    widened = torch_linear(many.float(), weight.float(), bias.float()).bfloat16()
    assert torch.equal(linear(many), widened)
    assert computed_in == [torch.bfloat16, torch.float32]
    # fp32 weights, and a CPU with bf16 arithmetic: F.linear as it is
    assert type(pack_linear(weight.float(), None, kernels)) is TorchLinear
    monkeypatch.setattr(cpu_isa, "has_bf16_matmul", lambda flags=None: True)
    assert type(pack_linear(weight, bias, kernels)) is TorchLinear


def test_onednn_failing_its_trial_row_is_left_for_f_linear(monkeypatch, caplog):
    """A packed oneDNN weight that cannot run a row fails at packing, once, not in a step."""

    def fails(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no bf16 matmul here")

    monkeypatch.setattr(linear_cpu.OneDnnLinear, "__call__", fails)
    with caplog.at_level(logging.WARNING):
        assert linear_cpu.tried_onednn_linear(randn(32, 64), None) is None
    assert "packed oneDNN linear unavailable, using F.linear" in caplog.text
