"""The bf16 linear kernel on packed weights, on AVX512-BF16 and on AMX's tiles where the
CPU has them (kernels/csrc/linear_amx.cpp), against an fp32 matmul; a row's result is
the same whichever rows share its call."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.kernels import cpu_isa, select_kernels
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.linear_cpu import kernel_takes, pack_linear

pytestmark = pytest.mark.cpu_kernels("linear_packed")
ops = select_kernels("auto", torch.device("cpu")).ops


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """The engine's linear layer on the CPU: the weight packed, then applied."""
    return ops.pack_linear(weight, bias)(x)


def silu_and_mul_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return ops.pack_silu_and_mul_linear(weight, bias)(x)


@pytest.fixture(params=[False, True], ids=["avx512", "amx"])
def tiles(request):
    """The kernel's AVX-512 code, and its AMX tiles where the CPU has them
    (tests/kernels/test_cpu_isa.py says why not)."""
    if request.param and (reason := cpu_isa.kernel_unavailable("amx_tiles")) is not None:
        pytest.skip(reason)
    module = load_cpu_kernels()
    before = module.set_amx_tiles(request.param)
    yield request.param
    module.set_amx_tiles(before)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


def assert_matches_fp32(actual: torch.Tensor, x, weight, bias) -> None:
    expected = torch.nn.functional.linear(
        x.float(), weight.float(), None if bias is None else bias.float()
    )
    assert actual.dtype == torch.bfloat16 and actual.shape == expected.shape
    # fp32 sums either way (bias included before rounding); the difference is the bf16
    # rounding of the result: within 2 ulps of bf16 (2^-7 relative).
    scale = expected.abs().clamp_min(1.0)
    assert ((actual.float() - expected).abs() / scale).max() < 2 * 2**-7


# Rows: below, at and past a tile of 8 (AVX-512) and of 16 and 32 (AMX), a step's sizes
# and past a run of 256; shapes: a projection, one panel, a long input row, and inputs
# not a multiple of 32 (which the tiles leave to the AVX-512 code).
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16, 17, 33, 64, 130, 300])
@pytest.mark.parametrize(
    ("out_features", "in_features"), [(960, 576), (32, 2), (64, 4864), (64, 100)]
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_an_fp32_matmul(tiles, rows, out_features, in_features, with_bias):
    x, weight = randn(rows, in_features), randn(out_features, in_features, seed=1)
    bias = randn(out_features, seed=2) if with_bias else None
    module = load_cpu_kernels()
    packed = module.pack_linear_weight(weight)
    assert packed.shape == (out_features // 32, in_features // 2, 32)
    assert_matches_fp32(module.linear_packed(x, packed, bias), x, weight, bias)
    assert_matches_fp32(linear(x, weight, bias), x, weight, bias)


def test_non_contiguous_rows_and_leading_dims():
    weight = randn(64, 96, seed=1)
    x = randn(10, 192)[:, ::2]  # every other column: not contiguous
    packed = pack_linear(weight, None, load_cpu_kernels())
    assert_matches_fp32(packed(x), x, weight, None)
    assert packed(randn(3, 7, 96)).shape == (3, 7, 64)


def test_the_kernel_takes_bf16_weights_of_32_outputs_and_even_inputs():
    module = load_cpu_kernels()
    weight = randn(64, 98)  # 98: even, neither a multiple of 3 nor of 4
    assert kernel_takes(module, weight) and kernel_takes(module, randn(32, 2))
    assert not kernel_takes(module, randn(64, 97)) and not kernel_takes(module, randn(48, 98))
    assert not kernel_takes(module, weight.float()) and not kernel_takes(None, weight)


@pytest.mark.parametrize(("out_features", "in_features"), [(200, 96), (64, 95)])
def test_other_shapes_go_to_onednn(out_features, in_features):
    # Outputs not a multiple of 32, or an odd input count, are not the kernel's.
    x, weight = randn(9, in_features), randn(out_features, in_features, seed=1)
    with pytest.raises(RuntimeError):
        load_cpu_kernels().pack_linear_weight(weight)
    assert_matches_fp32(linear(x, weight), x, weight, None)


@pytest.mark.parametrize("rows", [1, 8, 13, 64, 300])
@pytest.mark.parametrize(("intermediate", "in_features"), [(16, 64), (1536, 576)])
def test_gated_matches_silu_and_mul_of_an_fp32_matmul(tiles, rows, intermediate, in_features):
    x, weight = randn(rows, in_features), randn(2 * intermediate, in_features, seed=1) * 0.2
    sums = torch.nn.functional.linear(x.float(), weight.float())
    gate, up = sums.split(intermediate, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    actual = silu_and_mul_linear(x, weight)
    assert actual.dtype == torch.bfloat16 and actual.shape == (rows, intermediate)
    # From the fp32 sums: only the result's bf16 rounding (unfused, gate and up were
    # rounded first as well).
    scale = expected.abs().clamp_min(1.0)
    assert ((actual.float() - expected).abs() / scale).max() < 2 * 2**-7
    unfused = ops.silu_and_mul(linear(x, weight))
    assert ((actual.float() - unfused.float()).abs() / scale).max() < 4 * 2**-7


def test_gated_leaves_bias_and_other_dtypes_to_the_unfused_ops():
    x, weight, bias = randn(5, 64), randn(64, 64, seed=1), randn(64, seed=2)
    expected = ops.silu_and_mul(linear(x, weight, bias))
    assert torch.equal(silu_and_mul_linear(x, weight, bias), expected)
    xf, wf = x.float(), weight.float()
    assert torch.equal(silu_and_mul_linear(xf, wf), ops.silu_and_mul(linear(xf, wf)))


@pytest.mark.parametrize("rows", [1, 9, 40])
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_an_addend_joins_the_sums_before_rounding_and_activation(tiles, rows, gated):
    """LoRA's updates of a gate_up whose kernel fuses the activation: fp32 values added
    to the fp32 sums, gate then up, in the weight's own column order."""
    module = load_cpu_kernels()
    x, weight = randn(rows, 96), randn(128, 96, seed=1) * 0.2
    addend = torch.randn(rows, 128, generator=torch.Generator().manual_seed(3))
    pack = module.pack_gated_linear_weight if gated else module.pack_linear_weight
    actual = module.linear_packed(x, pack(weight), None, gated, addend)
    sums = torch.nn.functional.linear(x.float(), weight.float()) + addend
    if gated:
        gate, up = sums.split(64, dim=-1)
        sums = torch.nn.functional.silu(gate) * up
    scale = sums.abs().clamp_min(1.0)
    assert ((actual.float() - sums).abs() / scale).max() < 2 * 2**-7
    with pytest.raises(RuntimeError, match="addend"):
        module.linear_packed(x, pack(weight), None, gated, addend[:, :64].contiguous())


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_a_row_gives_the_same_bits_in_any_batch(tiles, gated):
    """A request's results do not depend on the rows it shares a step with: each row of
    a call of 300 rows (whole tiles, a shorter last one, two runs) as that row alone,
    and as part of a call of 17, bit for bit. (The AVX-512 code and the tiles differ in
    5 and 6 of these rows' bf16 results, plain and gated: a kernel that ran one row on the
    one and many on the other would fail here.)"""
    module = load_cpu_kernels()
    x, weight = randn(300, 576), randn(128, 576, seed=1) * 0.2
    bias = None if gated else randn(128, seed=2)
    packed = (module.pack_gated_linear_weight if gated else module.pack_linear_weight)(weight)
    batch = module.linear_packed(x, packed, bias, gated)
    some = module.linear_packed(x[100:117].contiguous(), packed, bias, gated)
    assert torch.equal(some, batch[100:117])
    for row in range(len(x)):
        alone = module.linear_packed(x[row : row + 1].contiguous(), packed, bias, gated)
        assert torch.equal(alone[0], batch[row]), row
