"""The quantized linear kernel on GGUF blocks against gguf-py's dequantized weight, and
the embedding's row lookup."""

from __future__ import annotations

import dataclasses
import functools

import gguf
import numpy as np
import pytest
import torch
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.linear_quantized import (
    ACTIVATION_LEVELS,
    DEQUANTIZE_ROWS_TYPES,
    KERNEL_TYPES,
    QuantizedLinear,
    dequantize_rows,
    quantize_activations,
    quantized_kernel_takes,
    quantized_linear_ref,
)
from hetero_infer.kernels.quantized import (
    INT8,
    QuantizedWeight,
    concat_rows,
    quantize_int8,
    row_bytes,
)

from tests.kernels.checks import refusals, strided


def kernel_module():
    module = load_cpu_kernels()
    if module is None or not module.quantized_linear_available():
        return None
    return module


needs_kernel = pytest.mark.cpu_kernels("quantized_linear")


@functools.cache
def quantized(qtype: str, out_features: int, in_features: int, seed: int = 1) -> QuantizedWeight:
    """Random floats quantized by gguf-py (its reference quantization)."""
    values = np.random.default_rng(seed).standard_normal((out_features, in_features))
    data = gguf.quants.quantize(values.astype(np.float32), gguf.GGMLQuantizationType[qtype])
    return QuantizedWeight(qtype, torch.from_numpy(data), (out_features, in_features))


@functools.cache
def dequantized(qtype: str, out_features: int, in_features: int) -> torch.Tensor:
    return quantized(qtype, out_features, in_features).dequantize(torch.float64)


@functools.cache
def packed(qtype: str, out_features: int, in_features: int) -> QuantizedLinear:
    return QuantizedLinear(kernel_module(), quantized(qtype, out_features, in_features))


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_matches_reference(
    actual: torch.Tensor, x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None
) -> None:
    """Against the same product in fp64 with the activations quantized as the kernel
    quantizes them: only the kernel's fp32 sums (one rounding per block's scaling and
    its addition, ~K/32 of them) and the bf16 rounding of the result differ."""
    expected = quantized_linear_ref(x, weight, bias)
    values, scales = quantize_activations(x, weight.activation_bits)
    blocks = values.double().abs().reshape(x.shape[0], -1, 32) * scales.double()[..., None]
    magnitude = blocks.reshape(x.shape) @ weight.dequantize(torch.float64).abs().T
    if bias is not None:
        magnitude = magnitude + bias.double().abs()
    assert actual.dtype == x.dtype and actual.shape == expected.shape
    rounding = 2**-8 if x.dtype == torch.bfloat16 else 0.0  # within one bf16 ulp
    error = (actual.double() - expected).abs()
    assert (error <= rounding * expected.abs() + 1e-5 * magnitude).all(), error.max()


SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (4096, 576)]  # SmolLM2-like
# gguf-py quantizes these; the K-quants (256-value super-blocks) are made of raw bytes.
SIMPLE_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")
# Below, at and past the tiles: 8 rows of one panel up to 16 rows, then 6 of two panels.
ROWS = [1, 3, 8, 16, 17, 64, 130]


def raw_weight(
    qtype: str, out_features: int, in_features: int, seed: int = 3, largest: bool = False
) -> QuantizedWeight:
    """Random bytes: every value the file may hold (Q8_0's and I8's -128, both nibbles'
    full range, the 5-bit types' fifth bits, Q4_K's and Q5_K's 6-bit scales and mins,
    Q6_K's int8 scales), not only what a quantizer makes; the fp16 scales (and mins)
    random but finite. ``largest``: every byte but those 0xFF (I8: -128), each value
    at its largest magnitude."""
    generator = torch.Generator().manual_seed(seed)
    if qtype == INT8:
        shape = (out_features, in_features)
        values = torch.randint(-128, 128, shape, dtype=torch.int8, generator=generator)
        if largest:
            values.fill_(-128)
        scales = torch.rand(out_features, generator=generator) * 0.02
        return QuantizedWeight(INT8, values, shape, scales)
    size = row_bytes(qtype, in_features)
    data = torch.randint(0, 256, (out_features, size), dtype=torch.uint8, generator=generator)
    if largest:
        data.fill_(0xFF)
    per_block = row_bytes(qtype, 256 if qtype in K_TYPES else 32)
    blocks = data.view(out_features, size // per_block, per_block)
    # The fp16 fields: Q8_0/Q4_0/Q5_0 d; Q4_1/Q5_1 d, m; Q4_K/Q5_K d, dmin; Q6_K d (last).
    fields = {"Q6_K": (208, 210), **dict.fromkeys(("Q4_1", "Q5_1", "Q4_K", "Q5_K"), (0, 4))}
    start, end = fields.get(qtype, (0, 2))
    halves = torch.randn(*blocks.shape[:2], (end - start) // 2, generator=generator)
    scale = 0.05 if qtype in K_TYPES else 1.0  # K-quants multiply d by up to 63 / 127
    blocks[..., start:end] = (halves * scale).half().view(torch.uint8)
    return QuantizedWeight(qtype, data, (out_features, in_features))


@needs_kernel
@pytest.mark.parametrize("qtype", SIMPLE_TYPES)
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_the_dequantized_product(qtype, out_features, in_features, rows, dtype, with_bias):
    weight = quantized(qtype, out_features, in_features)
    x = randn(rows, in_features, dtype=dtype)
    bias = randn(out_features, seed=2, dtype=dtype) if with_bias else None
    linear = packed(qtype, out_features, in_features)
    if bias is not None:
        linear = QuantizedLinear(kernel_module(), weight, bias)
    assert_matches_reference(linear(x), x, weight, bias)


@needs_kernel
@pytest.mark.parametrize("qtype", K_TYPES)
@pytest.mark.parametrize(("out_features", "in_features"), [(576, 1536), (64, 256), (2048, 512)])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_k_quants_match_the_dequantized_product(
    qtype, out_features, in_features, rows, dtype, with_bias
):
    weight = raw_weight(qtype, out_features, in_features)
    x = randn(rows, in_features, dtype=dtype)
    bias = randn(out_features, seed=2, dtype=dtype) if with_bias else None
    linear = QuantizedLinear(kernel_module(), weight, bias)
    assert_matches_reference(linear(x), x, weight, bias)


@needs_kernel
@pytest.mark.parametrize(("out_features", "in_features"), [(576, 576), (1536, 576), (576, 1536)])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_matches_the_dequantized_product(out_features, in_features, rows, dtype, with_bias):
    weight = raw_weight(INT8, out_features, in_features)
    x = randn(rows, in_features, dtype=dtype)
    bias = randn(out_features, seed=2, dtype=dtype) if with_bias else None
    assert_matches_reference(QuantizedLinear(kernel_module(), weight, bias)(x), x, weight, bias)


def test_quantize_int8_rounds_each_row_to_its_own_step():
    weight = randn(48, 64)
    weight[5] = 0.0  # a row of zeros: scale 0, values 0, no division by zero
    weight[7] *= 1000.0  # one large row does not coarsen the others
    quantized_weight = quantize_int8(weight.bfloat16())
    assert quantized_weight.qtype == INT8 and quantized_weight.shape == (48, 64)
    values, scales = quantized_weight.data, quantized_weight.scales
    assert values.dtype == torch.int8 and scales.dtype == torch.float32
    assert values.abs().amax(dim=1)[torch.arange(48) != 5].eq(127).all()  # each row's full range
    error = (quantized_weight.dequantize() - weight.bfloat16().float()).abs()
    assert (error <= scales[:, None] / 2 * (1 + 1e-6)).all()
    assert quantized_weight.dequantize()[5].eq(0).all() and scales[5] == 0


@needs_kernel
@pytest.mark.parametrize("qtype", SIMPLE_TYPES)
def test_activation_quantization_error_is_small(qtype):
    # Against the product of the unquantized activations: int8 per block of 32 keeps
    # the relative error near 0.5% (the step is amax / 127; measured 0.50-0.57%).
    x = randn(64, 576)
    actual = packed(qtype, 1536, 576)(x).double()
    exact = x.double() @ dequantized(qtype, 1536, 576).T
    assert ((actual - exact).norm() / exact.norm()).item() < 1e-2


@needs_kernel
@pytest.mark.parametrize("qtype", KERNEL_TYPES)
def test_raw_blocks_of_any_values(qtype):
    weight = raw_weight(qtype, 64, 512)
    x = randn(5, 512)
    assert_matches_reference(QuantizedLinear(kernel_module(), weight)(x), x, weight, None)


@needs_kernel
@pytest.mark.parametrize("qtype", KERNEL_TYPES)
@pytest.mark.parametrize("rows", [1, 2, 4, 7])
def test_the_largest_products_fit_the_integer_sums(qtype, rows):
    # Every weight value and every activation at its largest magnitude (a block of equal
    # values quantizes to +-127 throughout), signs alternating by row and by block: where
    # a kernel keeps partial sums in 16 bits (the AVX2 tiles), one too many would wrap.
    weight = raw_weight(qtype, 32, 512, largest=True)
    block_signs = torch.tensor([1.0, -1.0]).repeat(8)  # 16 blocks of 32
    row_signs = torch.tensor([1.0, -1.0]).repeat(rows)[:rows]
    x = (row_signs[:, None] * block_signs).repeat_interleave(32, dim=1)
    assert_matches_reference(QuantizedLinear(kernel_module(), weight)(x), x, weight, None)


@needs_kernel
def test_zero_blocks_and_leading_dims():
    weight = quantized("Q4_1", 64, 128)
    linear = QuantizedLinear(kernel_module(), weight)
    x = randn(3, 7, 128)
    x[0, :, 32:64] = 0  # a block of zeros: scale 0, no division by zero
    x[1] = 0
    actual = linear(x)
    assert actual.shape == (3, 7, 64)
    assert_matches_reference(actual.reshape(21, 64), x.reshape(21, 128), weight, None)
    strided = randn(4, 256)[:, ::2]  # not contiguous
    assert_matches_reference(linear(strided), strided.contiguous(), weight, None)
    assert linear(randn(0, 128)).shape == (0, 64)


@needs_kernel
def test_fp16_activations_go_through_fp32():
    weight = quantized("Q8_0", 64, 128)
    x = randn(5, 128, dtype=torch.float16)
    actual = QuantizedLinear(kernel_module(), weight)(x)
    assert actual.dtype == torch.float16
    expected = QuantizedLinear(kernel_module(), weight)(x.float())
    assert torch.equal(actual, expected.half())


@needs_kernel
def test_pack_keeps_the_bytes():
    module = kernel_module()
    for qtype in KERNEL_TYPES:
        weight = raw_weight(qtype, 32, 512)
        size = QuantizedLinear(module, weight).packed.numel()
        # Per row: Q4_K's and Q5_K's 6-bit scales and mins take a byte each (4 more per
        # 256 values); I8 adds its fp32 scale.
        extra = {"Q4_K": 4 * 512 // 256, "Q5_K": 4 * 512 // 256, INT8: 4}.get(qtype, 0)
        assert size == weight.data.numel() + 32 * extra


def pack_arguments(case: str) -> tuple[torch.Tensor, str, torch.Tensor | None]:
    """pack_quantized_weight's arguments for 32 rows of 64 Q8_0 values (two 34-byte
    blocks a row), then broken as ``case`` says ("none": left whole; "I8": 32 int8 rows
    and their scales)."""
    data, qtype, scales = torch.zeros(32, 68, dtype=torch.uint8), "Q8_0", None
    if case.startswith("I8"):
        int8 = raw_weight(INT8, 32, 64)
        data, qtype, scales = int8.data.view(torch.uint8), INT8, int8.scales
    match case:
        case "Q2_K":
            qtype = "Q2_K"
        case "1-d data":
            data = data.flatten()
        case "int8 data":
            data = data.view(torch.int8)
        case "I8 without scales":
            scales = None
        case "Q8_0 with scales":
            scales = torch.ones(32)
        case "I8 with 31 scales":
            scales = scales[:31]
        case "24 rows":
            data = data[:24]
        case "a byte past the blocks":
            data = torch.zeros(32, 69, dtype=torch.uint8)
    return data, qtype, scales


PACK_REFUSALS = {
    "quantized_linear does not take Q2_K": ["Q2_K"],
    r"data \[N, row_bytes\] uint8": ["1-d data", "int8 data"],
    r"scales \[N\] go with I8 weights, and only with them": [
        "I8 without scales",
        "Q8_0 with scales",
    ],
    r"scales \[N\]$": ["I8 with 31 scales"],
    "N must be a multiple of 16": ["24 rows"],
    "row_bytes must be whole Q8_0 blocks": ["a byte past the blocks"],
}


@needs_kernel
@pytest.mark.parametrize(("case", "message"), refusals(PACK_REFUSALS))
def test_pack_refuses_what_it_cannot_lay_out(case, message):
    module = kernel_module()
    assert module.pack_quantized_weight(*pack_arguments("none")).shape == (2, 16 * 68)
    assert module.pack_quantized_weight(*pack_arguments("I8")).shape == (2, 16 * (64 + 4))
    with pytest.raises(RuntimeError, match=message):
        module.pack_quantized_weight(*pack_arguments(case))


def linear_arguments(case: str) -> tuple[torch.Tensor, torch.Tensor, str, torch.Tensor, int]:
    """quantized_linear's arguments for 2 rows times 32 x 64 Q8_0 weights, with a bias,
    then broken as ``case`` says ("none": left whole)."""
    x, weight = randn(2, 64), packed("Q8_0", 32, 64).packed
    qtype, bias, bits = "Q8_0", torch.zeros(32), 8
    match case:
        case "Q2_K":
            qtype = "Q2_K"
        case "4-bit activations":
            bits = 4
        case "32-bit activations":
            bits = 32
        case "1-d x":
            x = x.flatten()
        case "3-d x":
            x = x[None]
        case "fp16 x":
            x = x.half()
        case "int64 x":
            x = x.long()
        case "x off the CPU":
            x = x.to("meta")
        case "48 inputs":
            x = randn(2, 48)
        case "128 inputs":
            x = randn(2, 128)
        case "1-d weight":
            weight = weight.flatten()
        case "int8 weight":
            weight = weight.view(torch.int8)
        case "strided weight":
            weight = strided(weight)
        case "33 biases":
            bias = torch.zeros(33)
    return x, weight, qtype, bias, bits


LINEAR_REFUSALS = {
    "quantized_linear does not take Q2_K": ["Q2_K"],
    "activation_bits is 8 or 16": ["4-bit activations", "32-bit activations"],
    r"x \[M, K\] bf16 or fp32 on the CPU": [
        "1-d x",
        "3-d x",
        "fp16 x",
        "int64 x",
        "x off the CPU",
    ],
    "K must be whole Q8_0 blocks": ["48 inputs"],
    "packed weight does not fit x": ["128 inputs", "1-d weight", "int8 weight", "strided weight"],
    r"bias \[N\]": ["33 biases"],
}


@needs_kernel
@pytest.mark.parametrize(("case", "message"), refusals(LINEAR_REFUSALS))
def test_the_kernel_refuses_what_it_cannot_multiply(case, message):
    """Each check; a whole call taken with 8- and 16-bit activations and without a bias."""
    module = kernel_module()
    x, weight, qtype, bias, _ = linear_arguments("none")
    for bits in (8, 16):
        assert module.quantized_linear(x, weight, qtype, bias, bits).shape == (2, 32)
    assert module.quantized_linear(x, weight, qtype, None).shape == (2, 32)
    with pytest.raises(RuntimeError, match=message):
        module.quantized_linear(*linear_arguments(case))


def wide(weight: QuantizedWeight) -> QuantizedWeight:
    """The weight with the kernel rounding activations to 16 bits."""
    return dataclasses.replace(weight, activation_bits=16)


def with_outlier_channels(x: torch.Tensor) -> torch.Tensor:
    """x with a few channels 40x the rest (as Gemma's normed activations have): each
    block of 32 holding one has its int8 step set by it."""
    x = x.clone()
    x[:, [3, 70, 200, 333]] *= 40.0
    return x


@needs_kernel
@pytest.mark.parametrize("qtype", KERNEL_TYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_wide_activations_match_the_dequantized_product(qtype, rows, dtype, with_bias):
    # Every type's unpacking, at tiles of 1 to 6 rows and 1 or 2 panels (64 outputs:
    # 4 panels), with 16-bit activations: the kernel's high and low bytes add up to
    # the reference's 16-bit values.
    weight = wide(raw_weight(qtype, 64, 512))
    x = with_outlier_channels(randn(rows, 512, dtype=dtype))
    bias = randn(64, seed=2, dtype=dtype) if with_bias else None
    assert_matches_reference(QuantizedLinear(kernel_module(), weight, bias)(x), x, weight, bias)


@needs_kernel
@pytest.mark.parametrize("qtype", SIMPLE_TYPES)
@pytest.mark.parametrize("rows", [1, 17])
def test_wide_activations_on_real_quantized_shapes(qtype, rows):
    weight = wide(quantized(qtype, 1536, 576))
    x = randn(rows, 576, dtype=torch.bfloat16)
    assert_matches_reference(QuantizedLinear(kernel_module(), weight)(x), x, weight, None)


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q5_0", "Q6_K", "Q4_K", "Q8_0"])
def test_wide_activations_keep_outlier_channels_accurate(qtype):
    # Against the product of the unquantized activations: with outlier channels int8
    # leaves ~1% relative error (measured 0.7-1.2%), 16 bits ~250x less (measured
    # 3-6e-5), below bf16's own rounding of the result.
    weight = raw_weight(qtype, 256, 512)
    x = with_outlier_channels(randn(64, 512))
    exact = x.double() @ weight.dequantize(torch.float64).T

    def error(w: QuantizedWeight) -> float:
        actual = QuantizedLinear(kernel_module(), w)(x).double()
        return ((actual - exact).norm() / exact.norm()).item()

    narrow, wide_error = error(weight), error(wide(weight))
    assert narrow > 3e-3
    assert wide_error < 2e-4 and wide_error < narrow / 50


def test_wide_activation_values_fit_the_kernels_split():
    # The kernel multiplies each 16-bit value v as 256 h + l, h = (v + 128) >> 8 and
    # l = v - 256 h, both int8: v stays within +-127 x 257.
    x = with_outlier_channels(randn(8, 512))
    x[2, :32] = 0.0  # a block of zeros: scale 0
    values, scales = quantize_activations(x, 16)
    assert values.dtype == torch.int16 and scales.shape == (8, 16)
    levels = int(ACTIVATION_LEVELS[16])
    blocks = values.int().reshape(8, 16, 32)
    assert blocks.abs().amax(dim=-1)[scales > 0].eq(levels).all()
    high = (blocks + 128) >> 8
    low = blocks - 256 * high
    assert high.abs().max() <= 127 and low.min() >= -128 and low.max() <= 127
    assert blocks[2, 0].eq(0).all() and scales[2, 0] == 0
    # Within half a step, give or take the fp32 rounding of the scale and of L / amax
    # (2^-24 of L steps each)
    dequantized = (blocks.double() * scales.double()[..., None]).reshape(x.shape)
    step = scales.double().repeat_interleave(32, 1)
    slack = 0.5 + 2 * levels * 2**-24
    assert ((dequantized - x.double()).abs() <= step * slack).all()


def test_activation_bits_travel_with_the_weight():
    weight = wide(quantized("Q4_0", 64, 128))
    assert weight.rows(slice(0, 32)).activation_bits == 16
    assert concat_rows([weight, weight]).activation_bits == 16
    assert concat_rows([weight, quantized("Q4_0", 64, 128)]) is None  # one kernel call: one width
    with pytest.raises(AssertionError):
        dataclasses.replace(weight, activation_bits=4)


class NoKernel:
    @staticmethod
    def quantized_linear_available() -> bool:
        return False


def test_predicate():
    module = kernel_module()
    q8 = quantized("Q8_0", 64, 64)
    assert not quantized_kernel_takes(None, q8)
    assert not quantized_kernel_takes(NoKernel(), q8)
    if module is None:
        return
    for qtype in KERNEL_TYPES:
        assert quantized_kernel_takes(module, raw_weight(qtype, 64, 256))
    assert not quantized_kernel_takes(module, quantized("Q8_0", 40, 64))  # not whole panels
    assert not quantized_kernel_takes(module, raw_weight(INT8, 40, 64))


@pytest.mark.parametrize("qtype", DEQUANTIZE_ROWS_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_rows_matches_gguf(qtype, dtype):
    weight = raw_weight(qtype, 100, 512) if qtype in K_TYPES else quantized(qtype, 100, 96)
    table = weight.dequantize(torch.float32)
    ids = torch.tensor([3, 0, 99, 3])
    assert torch.equal(dequantize_rows(weight, ids, dtype), table[ids].to(dtype))
    grid = torch.tensor([[5, 6], [7, 99]])
    assert torch.equal(dequantize_rows(weight, grid, dtype), table[grid].to(dtype))
    assert dequantize_rows(weight, ids[:0], dtype).shape == (0, weight.shape[1])
