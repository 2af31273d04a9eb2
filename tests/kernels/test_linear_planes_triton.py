"""The GPU's planes for GGUF blocks (kernels/quantized_planes.py) and the Triton kernels
on them (kernels/linear_planes_triton.py), under the interpreter on CPU tensors.

The repack must give back the file's bytes exactly (the planes are the only copy the
model keeps). The kernels multiply each half-chunk's integers exactly and scale the fp32
sums, so they differ from ``x @ dequantize(W)^T`` in fp64 by fp32 rounding only, plus
the rounding of the result to x's dtype.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch

pytest.importorskip("triton")

from hetero_infer.kernels import triton_backend  # noqa: E402
from hetero_infer.kernels.linear_planes_triton import (  # noqa: E402
    PlanesLinear,
    PlanesTiles,
    choose_planes_tiles,
    planes_linear,
    planes_linear_triton,
    planes_triton_takes,
)
from hetero_infer.kernels.linear_quantized import dequantize_rows  # noqa: E402
from hetero_infer.kernels.planes_gemv_triton import GEMV_WORD_TYPES  # noqa: E402
from hetero_infer.kernels.quantized import QuantizedWeight, row_bytes  # noqa: E402
from hetero_infer.kernels.quantized_planes import (  # noqa: E402
    ALIGN,
    BLOCK_VALUES,
    PLANE_TYPES,
    PlanarWeight,
    pack_planes,
    unpack_planes,
)
from hetero_infer.kernels.triton_utils import DeviceInfo  # noqa: E402

from tests.kernels.test_linear_quantized_triton import run_gguf, tiny_gguf  # noqa: E402,F401
from tests.kernels.test_quantized_linear import randn, raw_weight  # noqa: E402

DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16"}


def random_blocks(qtype: str, out_features: int, in_features: int, seed: int = 0):
    """Any bytes at all, fp16 fields included (NaN and infinity patterns too): the
    repack moves bytes, it never reads them as numbers."""
    generator = torch.Generator().manual_seed(seed)
    shape = (out_features, row_bytes(qtype, in_features))
    data = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    return QuantizedWeight(qtype, data, (out_features, in_features))


# (rows, in_features in blocks): one row; rows that fill no tile (7, 33); one block and
# an odd number of them (a 32-value type's row of 11 blocks: 352 values).
LOSSLESS_SHAPES = [(1, 1), (7, 3), (33, 11), (64, 2)]


@pytest.mark.parametrize("qtype", PLANE_TYPES)
@pytest.mark.parametrize(("rows", "blocks"), LOSSLESS_SHAPES, ids=lambda v: str(v))
def test_the_repack_is_lossless(qtype, rows, blocks):
    weight = random_blocks(qtype, rows, blocks * BLOCK_VALUES[qtype])
    planes = pack_planes(weight)
    assert torch.equal(unpack_planes(planes).data, weight.data)
    for name, plane in planes.planes.items():
        # Every plane row starts on a 16-byte boundary, in storage of its own (the file's
        # bytes can go).
        assert plane.stride(1) == 1 and plane.stride(0) * plane.element_size() % ALIGN == 0, name
        assert plane.data_ptr() % ALIGN == 0, name
        assert plane.untyped_storage().data_ptr() != weight.data.untyped_storage().data_ptr()
    # Some rows, as an embedding looks them up or tensor parallelism shards them.
    index = torch.tensor([rows - 1, 0, rows // 2])
    assert torch.equal(unpack_planes(planes.rows(index)).data, weight.data[index])


def test_planes_dequantize_and_look_up_rows_as_the_blocks_do():
    for qtype in ("Q8_0", "Q4_K", "Q5_1"):
        weight = raw_weight(qtype, 12, 512)
        planes = pack_planes(weight)
        assert torch.equal(planes.dequantize(torch.float64), weight.dequantize(torch.float64))
        ids = torch.tensor([[3, 0], [11, 3]])
        expected = dequantize_rows(weight, ids, torch.float32)
        assert torch.equal(dequantize_rows(planes, ids, torch.float32), expected)


@functools.cache
def planar(qtype: str, out_features: int, in_features: int) -> tuple[QuantizedWeight, PlanarWeight]:
    weight = raw_weight(qtype, out_features, in_features)
    return weight, pack_planes(weight)


def assert_matches(
    actual: torch.Tensor, x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None
) -> None:
    """|actual - exact| <= rounding to x's dtype + fp32 rounding of the sums (1e-6 of
    sum |x| |w|: per 16 values a product, its scaling and its addition)."""
    dequantized = weight.dequantize(torch.float64)
    exact = x.double() @ dequantized.T
    magnitude = x.double().abs() @ dequantized.abs().T
    if bias is not None:
        exact, magnitude = exact + bias.double(), magnitude + bias.double().abs()
    assert actual.dtype == x.dtype and actual.shape == exact.shape, (actual.dtype, actual.shape)
    rounding = 0.0 if x.dtype == torch.float32 else 2**-11  # half an fp16 ulp
    error = (actual.double() - exact).abs()
    bound = rounding * exact.abs() + 1e-6 * magnitude
    assert (error <= bound).all(), f"max error {error.max():.3g}, at {(error - bound).argmax()}"


GPU = DeviceInfo(False, 132, (9, 0))
INTERPRETER = DeviceInfo(True, 1, (0, 0))

# (rows, dtype, (out_features, in_features), bias, tiles): each kernel with the tiles a
# GPU takes for its rows (choose_planes_tiles on an H200-like device), and with a split
# of K where the GPU's choice has none at these sizes; outputs that fill no tile (72 of
# 16s, 40 of 64s), one step of K (256) and two (512), a row's last step ending early
# (352: 8 blocks and 3).
CASES = [
    ("gemv", 1, torch.float32, (72, 512), False, PlanesTiles("gemv", 1, 2, 1, 1, 3, 8)),
    ("gemv", 2, torch.float16, (64, 256), True, PlanesTiles("gemv", 2, 2, 1, 1, 3, 8)),
    ("gemv", 3, torch.float32, (72, 352), True, PlanesTiles("gemv", 4, 16, 2, 4, 1)),
    ("gemv", 4, torch.float16, (40, 512), False, PlanesTiles("gemv", 4, 16, 2, 4, 1)),
    # Steps a loop turn: a split's last turn past its end (5 steps split 3 + 2, 2 a
    # turn), 4 a turn over 2 steps, the last of them ending early (1312: 41 blocks), and
    # 16 a turn over 17 steps (the second turn's 15 past the row's end).
    ("gemv-unrolled", 1, torch.float32, (40, 1280), False, PlanesTiles("gemv", 1, 8, 2, 1, 3, 2)),
    ("gemv-unrolled", 2, torch.float16, (72, 1312), True, PlanesTiles("gemv", 2, 4, 1, 1, 3, 4)),
    ("gemv-unrolled", 1, torch.float16, (24, 4352), False, PlanesTiles("gemv", 1, 1, 1, 1, 3, 16)),
    ("split-K", 5, torch.float32, (72, 512), True, PlanesTiles("dot", 16, 64, 2, 4, 1)),
    ("split-K", 32, torch.float16, (72, 352), False, choose_planes_tiles(GPU, 32, 72, 2, "Q5_1")),
    ("tiles", 40, torch.float32, (72, 256), False, choose_planes_tiles(GPU, 40, 72, 1, "Q5_1")),
    ("tiles", 33, torch.float16, (96, 512), True, PlanesTiles("dot", 64, 64, 1, 4, 1)),
]
CASE_IDS = [f"{kind}-{m}-{DTYPE_IDS[dt]}-{n}x{k}" for kind, m, dt, (n, k), *_ in CASES]


@pytest.mark.parametrize("qtype", PLANE_TYPES)
@pytest.mark.parametrize(
    ("kind", "rows", "dtype", "shape", "with_bias", "tiles"), CASES, ids=CASE_IDS
)
def test_kernels_match_the_dequantized_product(qtype, kind, rows, dtype, shape, with_bias, tiles):
    out_features, in_features = shape
    if qtype.endswith("_K") and in_features % 256:
        in_features = 512  # a K-quant's rows are whole super-blocks
    weight, planes = planar(qtype, out_features, in_features)
    x = randn(rows, in_features, dtype=dtype, seed=rows)
    bias = randn(out_features, seed=2) if with_bias else None
    actual = planes_linear_triton(x, planes, bias, tiles=tiles)
    assert_matches(actual, x, weight, bias)


# The word GEMV (kernels/planes_gemv_triton.py) on the types it takes: the choice under
# the interpreter and on a GPU, K split in 3, 2 chunks a lane a turn, rows that fill no
# tile with 2 warps.
WORD_CASES = [
    (1, torch.float32, (72, 512), False, None),
    (2, torch.float16, (64, 256), True, choose_planes_tiles(GPU, 2, 64, 1, "Q4_0")),
    (3, torch.float32, (72, 512), True, PlanesTiles("words", 4, 16, 3, 1, 1, 1)),
    (4, torch.float16, (40, 1024), False, PlanesTiles("words", 4, 8, 2, 1, 1, 2)),
    (1, torch.float32, (7, 256), True, PlanesTiles("words", 1, 4, 1, 2, 1, 1)),
]


@pytest.mark.parametrize("qtype", GEMV_WORD_TYPES)
@pytest.mark.parametrize(
    ("rows", "dtype", "shape", "with_bias", "tiles"),
    WORD_CASES,
    ids=[f"{m}-{DTYPE_IDS[dt]}-{n}x{k}-{i}" for i, (m, dt, (n, k), *_) in enumerate(WORD_CASES)],
)
def test_the_word_gemv_matches_the_dequantized_product(qtype, rows, dtype, shape, with_bias, tiles):
    out_features, in_features = shape
    weight, planes = planar(qtype, out_features, in_features)
    x = randn(rows, in_features, dtype=dtype, seed=rows)
    bias = randn(out_features, seed=2) if with_bias else None
    if tiles is None:
        tiles = choose_planes_tiles(INTERPRETER, rows, out_features, in_features // 256, qtype)
        assert tiles.kernel == "words"
    assert_matches(planes_linear_triton(x, planes, bias, tiles=tiles), x, weight, bias)


def test_the_rows_and_the_type_choose_the_kernel():
    for qtype in PLANE_TYPES:  # every type's decode: the word GEMV
        assert choose_planes_tiles(GPU, 1, 4096, 16, qtype) == PlanesTiles("words", 1, 8, 1, 4, 1)
    assert choose_planes_tiles(GPU, 3, 4096, 16, "Q5_0").block_m == 4
    # A type the word GEMV would not take: the byte-wise GEMV's tiles.
    assert choose_planes_tiles(GPU, 1, 4096, 16, "X") == PlanesTiles("gemv", 1, 2, 1, 1, 3, 8)
    # narrow outputs, long rows: K split until about two programs per SM
    narrow = choose_planes_tiles(GPU, 1, 256, 56, "X")
    assert narrow.kernel == "gemv" and 128 * narrow.num_splits <= 2 * 132 + 128
    assert narrow.num_splits > 1
    narrow = choose_planes_tiles(GPU, 1, 256, 56, "Q4_K")
    assert narrow.kernel == "words" and 32 * narrow.num_splits <= 2 * 132 + 32
    assert narrow.num_splits > 1
    split = choose_planes_tiles(GPU, 16, 4096, 56, "Q4_0")
    assert (split.kernel, split.block_m, split.num_splits) == ("dot", 16, 5)
    assert choose_planes_tiles(GPU, 32, 4096, 16, "Q8_0").block_m == 32
    assert choose_planes_tiles(GPU, 33, 4096, 16, "Q4_0") == PlanesTiles("dot", 64, 64, 1, 4, 2)


def test_the_layer_over_leading_dims_strides_and_empty_batches():
    weight = raw_weight("Q4_K", 48, 256)
    linear = planes_linear(weight, randn(48, seed=2, dtype=torch.float16))
    assert isinstance(linear, PlanesLinear) and linear.repacked_weight.qtype == "Q4_K"
    x = randn(2, 3, 256)
    actual = linear(x)
    assert actual.shape == (2, 3, 48)
    assert_matches(actual.reshape(6, 48), x.reshape(6, 256), weight, linear.bias)
    strided = randn(4, 512)[:, ::2]  # not contiguous
    assert_matches(linear(strided), strided.contiguous(), weight, linear.bias)
    assert linear(randn(0, 256)).shape == (0, 48)


def test_takes_blocks_on_a_gpu_and_planes():
    weight = raw_weight("Q4_0", 16, 64)
    assert not planes_triton_takes(weight)  # blocks on the CPU keep the file's kernel
    assert planes_triton_takes(pack_planes(weight))  # the interpreter runs planes
    assert not planes_triton_takes(torch.zeros(16, 64))
    assert not planes_triton_takes(raw_weight("I8", 16, 64))


def test_tiny_gguf_model_on_planes_matches_dequantized(tiny_gguf, monkeypatch):  # noqa: F811
    """The GPU's wiring on CPU tensors: every projection's blocks and the tied Q8_0
    embedding repacked into planes at pack time (lookups then read the planes), the same
    greedy tokens as every weight dequantized at load."""
    from hetero_infer.engine.loader import metadata
    from hetero_infer.engine.models.layers import Linear
    from hetero_infer.kernels import linear_planes_triton

    folder, path = tiny_gguf
    monkeypatch.setattr(metadata, "gguf_metadata_folder", lambda source: folder)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (7, 3)]
    expected = run_gguf(path, "none", prompts)

    def takes_on_cpu(weight: object) -> bool:  # as a GPU would take them
        if isinstance(weight, QuantizedWeight):
            return weight.qtype in PLANE_TYPES
        return isinstance(weight, PlanarWeight)

    monkeypatch.setattr(triton_backend, "planes_triton_takes", takes_on_cpu)
    calls: list[str] = []
    launch = linear_planes_triton.planes_linear_triton

    def counted(x, weight, bias=None, **kwargs):
        calls.append(weight.qtype)
        return launch(x, weight, bias, **kwargs)

    monkeypatch.setattr(linear_planes_triton, "planes_linear_triton", counted)
    models = []
    pack = Linear.pack_weight

    def pack_and_keep(self: Linear) -> None:
        pack(self)
        models.append(self)

    monkeypatch.setattr(Linear, "pack_weight", pack_and_keep)
    actual = run_gguf(path, "gguf", prompts)
    assert set(calls) == {"Q4_0", "Q8_0", "Q4_1", "Q5_0", "Q5_1"}, set(calls)
    kept = [linear.quantized for linear in models if linear.quantized is not None]
    # q/k/v, gate/up (inside the activation's wrapper) and down: no file bytes left
    assert len(kept) == 3 * 2 and all(isinstance(w, PlanarWeight) for w in kept), kept
    assert actual == expected


@pytest.mark.cuda
@pytest.mark.parametrize("qtype", PLANE_TYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_kernels_on_cuda(qtype, dtype):
    """Compiled, with the device's own choice of kernel by rows (gemv, split-K, tiles),
    the planes made on the GPU from the blocks there, as at load; bf16 results within an
    ulp of the fp32 sum (the GPU rounds to nearest)."""
    from hetero_infer.kernels.triton_utils import interpreting

    if interpreting():
        pytest.skip("the Triton kernels are interpreted in this run: set TRITON_INTERPRET=0")
    in_features = 2048 if qtype.endswith("_K") else 2080  # 8 steps, or 8 and a 1-block one
    weight = raw_weight(qtype, 200, in_features)
    planes = pack_planes(QuantizedWeight(qtype, weight.data.cuda(), weight.shape))
    assert torch.equal(unpack_planes(planes).data.cpu(), weight.data)
    bias = randn(200, seed=2)
    for rows in (1, 3, 16, 32, 70):
        x = randn(rows, in_features, dtype=dtype, seed=rows)
        actual = planes_linear_triton(x.cuda(), planes, bias.cuda()).cpu()
        if dtype == torch.float16:
            assert_matches(actual, x, weight, bias)
            continue
        dequantized = weight.dequantize(torch.float64)
        exact = x.double() @ dequantized.T + bias.double()
        magnitude = float((x.double().abs() @ dequantized.abs().T).max())
        torch.testing.assert_close(actual.double(), exact, rtol=2**-7, atol=1e-6 * magnitude)
