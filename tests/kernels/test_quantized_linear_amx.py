"""The quantized linear kernel on AMX's int8 tiles (kernels/csrc/quantized_linear_amx.cpp)
gives the AVX512-VNNI kernel's bits: the same integer sums per scale group and the same
fp32 steps after them, for every type, both activation widths, and calls of every row
count the tiles take (whole tiles of 16 rows and a shorter last one, runs of rows and of
panels, an odd number of scale groups). Skipped where the CPU has no tiles; the switch
between the two is the kernels' (set_amx_tiles), as the engine's cpu_amx setting."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.kernels.linear_quantized import BF16_TILES_FROM, QuantizedLinear
from hetero_infer.kernels.quantized import INT8

from tests.kernels.test_quantized_linear import (
    K_TYPES,
    SIMPLE_TYPES,
    kernel_module,
    randn,
    raw_weight,
    wide,
)

needs_tiles = pytest.mark.cpu_kernels("quantized_linear", "amx_tiles")
# From kAmxRows (96) on: a whole number of 16-row tiles, a shorter last tile, and more
# than a run of 256 rows (300: 256 + 44, its last tile 12 rows).
ROWS = [96, 113, 300]


@pytest.fixture
def module():
    module = kernel_module()
    before = module.set_amx_tiles(True)
    yield module
    module.set_amx_tiles(before)


def on_both(module, linear: QuantizedLinear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the VNNI kernel's result, the tiles')."""
    module.set_amx_tiles(False)
    vnni = linear(x)
    module.set_amx_tiles(True)
    return vnni, linear(x)


@needs_tiles
@pytest.mark.parametrize("qtype", (*SIMPLE_TYPES, *K_TYPES, INT8))
@pytest.mark.parametrize("bits", [8, 16])
def test_the_tiles_give_the_vnni_kernels_bits(module, qtype, bits):
    # 17 blocks (an odd number of groups: the last pair has one) for the simple types,
    # 3 super-blocks for the K-quants; 65 panels: each thread's share more than one run
    # of unpacked panels (256 KB).
    in_features = 768 if qtype in K_TYPES else 544
    weight = raw_weight(qtype, 1040, in_features)
    weight = wide(weight) if bits == 16 else weight
    linear = QuantizedLinear(module, weight, randn(1040, seed=5))
    for rows in ROWS:
        for dtype in (torch.bfloat16, torch.float32):
            x = randn(rows, in_features, seed=rows, dtype=dtype)
            vnni, tiles = on_both(module, linear, x)
            assert torch.equal(vnni, tiles), (rows, dtype, (vnni - tiles).abs().max())


@needs_tiles
def test_the_switch_is_the_engines_cpu_amx_setting(module):
    """select_kernels turns the tiles on or off by the engine's cpu_amx."""
    from hetero_infer.kernels import select_kernels

    select_kernels("auto", torch.device("cpu"), amx=False)
    assert module.set_amx_tiles(True) is False
    select_kernels("auto", torch.device("cpu"), amx=True)
    assert module.set_amx_tiles(True) is True


@needs_tiles
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "I8"])
def test_experts_with_many_tokens_take_the_tiles_with_the_same_bits(module, qtype):
    """A mixture-of-experts step's expert with 96 tokens and more (a prefill's) goes to
    the tiles, the others to the VNNI kernel: the block's output is the same."""
    from tests.kernels.test_moe_cpu import HIDDEN, block_for, random_routing

    moe, _ = block_for(qtype, top_k=2)
    x = torch.randn(400, HIDDEN, generator=torch.Generator().manual_seed(9))
    ids, weights = random_routing(400, 2, seed=9)  # ~133 tokens an expert
    module.set_amx_tiles(False)
    vnni = moe.block.experts(x, ids, weights)
    module.set_amx_tiles(True)
    assert torch.equal(vnni, moe.block.experts(x, ids, weights))


@needs_tiles
@pytest.mark.parametrize("qtype", (*SIMPLE_TYPES, *K_TYPES, INT8))
def test_bf16_tiles_match_the_dequantized_product(module, qtype):
    """The other path (cpu_linear_kernel other than "kernel"): the weight dequantized to
    bf16 a few panels at a time, x rounded to bf16, the sums in fp32 in the tiles: within
    the two bf16 roundings of the fp64 product (and the output's, in bf16)."""
    in_features = 768 if qtype in K_TYPES else 544
    weight = raw_weight(qtype, 1040, in_features)
    linear = QuantizedLinear(module, weight, randn(1040, seed=5))
    dequantized = weight.dequantize(torch.float64)
    for rows in (1, 17, 300):
        for dtype in (torch.bfloat16, torch.float32):
            x = randn(rows, in_features, seed=rows, dtype=dtype)
            out = module.quantized_linear_bf16(x, linear.packed, qtype, linear.bias)
            assert out.dtype == dtype and out.shape == (rows, 1040)
            x_bf16 = x.bfloat16().double()
            expected = x_bf16 @ dequantized.T + linear.bias.double()
            magnitude = x_bf16.abs() @ dequantized.abs().T
            error = (out.double() - expected).abs()
            assert (error <= 2**-8 * (magnitude + expected.abs()) + 1e-6).all(), error.max()


@needs_tiles
def test_bf16_tiles_take_the_calls_of_many_rows_only(module):
    weight = raw_weight("Q4_1", 96, 512)
    tiled = QuantizedLinear(module, weight, bf16_tiles=True)
    plain = QuantizedLinear(module, weight)
    few, many = (randn(rows, 512, dtype=torch.bfloat16) for rows in (BF16_TILES_FROM - 1, 200))
    assert torch.equal(tiled(few), plain(few))  # the int8 kernels' below the threshold
    on_tiles = module.quantized_linear_bf16(many, tiled.packed, "Q4_1", None)
    assert torch.equal(tiled(many), on_tiles)
    assert not torch.equal(plain(many), on_tiles)
    module.set_amx_tiles(False)  # the switch turns this path off too
    assert torch.equal(tiled(many), plain(many))
