"""Triton paged attention and store_kv against the torch references (interpreter).

Every batch puts each sequence's blocks at shuffled physical positions of a cache
filled with noise, so a wrong gather or a missing mask shows. Expected values come
from the torch reference in fp32 on the same (rounded) inputs.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hetero_infer.kernels.kv_quant import stored_head_size  # noqa: E402
from hetero_infer.kernels.paged_attention import (  # noqa: E402
    paged_attention_ref,
    prepare_torch_attention,
    store_kv_ref,
)
from hetero_infer.kernels.paged_attention_triton import (  # noqa: E402
    AttentionTiles,
    paged_attention_triton,
)
from hetero_infer.kernels.store_kv_triton import store_kv_triton  # noqa: E402

from tests.kernels.batches import Batch, make_batch, quantized  # noqa: E402
from tests.kernels.checks import assert_close  # noqa: E402

SCALE = 0.3
# Scaled scores here are ~1.3 (head_dim 20): a cap of 2 bends most (Gemma 2's soft-capping).
SOFTCAP = 2.0


def reference(batch: Batch, window: int | None, softcap: float | None = None) -> torch.Tensor:
    """fp32 torch reference: store_kv_ref then paged_attention_ref on upcast copies."""
    k_cache, v_cache = batch.k_cache.float(), batch.v_cache.float()
    inputs = batch.inputs
    store_kv_ref(batch.key.float(), batch.value.float(), k_cache, v_cache, inputs.slot_mapping)
    meta = prepare_torch_attention(inputs, k_cache.shape[1], {window})
    query = batch.query.float()
    return paged_attention_ref(query, k_cache, v_cache, meta, SCALE, window, softcap)


def run_triton(
    batch: Batch,
    window: int | None,
    tiles: AttentionTiles | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    store_kv_triton(batch.key, batch.value, k_cache, v_cache, batch.inputs.slot_mapping)
    return paged_attention_triton(
        batch.query, k_cache, v_cache, batch.inputs, SCALE, window, softcap, tiles=tiles
    )


def decode_chunks(block_size: int) -> list[tuple[int, int]]:
    # context lengths (after this step) 1, bs - 1, bs, bs + 1, several blocks
    return [(n - 1, 1) for n in (1, block_size - 1, block_size, block_size + 1, 3 * block_size + 5)]


def mixed_chunks(block_size: int) -> list[tuple[int, int]]:
    # first prefill chunks, decodes, and chunks after cached context (chunked prefill,
    # prefix-cache hits), chunk ends on and off block boundaries
    bs = block_size
    return [(0, 1), (0, 7), (bs - 1, 1), (bs, 5), (bs + 1, 2 * bs + 3), (2 * bs, 1), (5, bs)]


def small_tiles(group: int, num_splits: int = 1) -> AttentionTiles:
    """The smallest legal tiles: many loop steps and query tiles per sequence."""
    return AttentionTiles(max(16, 1 << (group - 1).bit_length()), 16, num_splits, 4, 1)


HEAD_DIM_FOR_GROUP = {1: 24, 3: 20, 8: 12}  # the tiny test models' odd head sizes
FP32, FP16 = torch.float32, torch.float16
DTYPE_ID = {FP32: "fp32", FP16: "fp16"}


def param_id(value) -> str:
    return DTYPE_ID.get(value, str(value))


# (dtype, block_size, group): each group with both block sizes (16-key tiles as long as
# a block, and half of one), the dtype alternating so that each dtype meets each block
# size and each group. The dtype picks only how the dots multiply (DOT_FP32) and the
# rounding of the output; the block size and group, the gather and the rows' layout.
REFERENCE_CASES = [
    (FP32, 16, 1),
    (FP16, 32, 1),
    (FP16, 16, 3),
    (FP32, 32, 3),
    (FP32, 16, 8),
    (FP16, 32, 8),
]


@pytest.mark.parametrize(("dtype", "block_size", "group"), REFERENCE_CASES, ids=param_id)
def test_attention_matches_reference(dtype, block_size, group):
    num_kv_heads = 2 if group < 8 else 1
    head_dim = HEAD_DIM_FOR_GROUP[group]
    for kind, chunks in (
        ("decode", decode_chunks(block_size)),
        ("mixed", mixed_chunks(block_size)),
    ):
        batch = make_batch(chunks, block_size, num_kv_heads, group, head_dim, dtype, seed=group)
        expected = reference(batch, None)
        assert_close(run_triton(batch, None), expected, dtype, f"{kind}, device tiles")
        out = run_triton(batch, None, small_tiles(group))
        assert_close(out, expected, dtype, f"{kind}, 16-key tiles")


@pytest.mark.parametrize("head_dim", [12, 20, 24, 64, 80, 96, 128])
def test_attention_head_dims(head_dim):
    dtype = torch.float16
    chunks = [(0, 3), (20, 1), (9, 8)]
    batch = make_batch(chunks, 16, 1, 2, head_dim, dtype, seed=head_dim)
    assert_close(run_triton(batch, None), reference(batch, None), dtype, f"head_dim {head_dim}")


# (num_splits, dtype, softcap, batch): each pair of these choices meets in some case.
# The split path is the same code whatever the dtype and the cap; the batch decides
# what the splits hold (decodes: short contexts leave splits empty; mixed: tiles of 5
# tokens whose rows see keys in different splits).
SPLIT_CASES = [
    (2, FP32, None, "mixed"),
    (2, FP16, SOFTCAP, "decode"),
    (8, FP32, SOFTCAP, "decode"),
    (8, FP16, None, "decode"),
    (8, FP16, SOFTCAP, "mixed"),
]
CHUNKS = {"decode": decode_chunks, "mixed": mixed_chunks}


@pytest.mark.parametrize(("num_splits", "dtype", "softcap", "kind"), SPLIT_CASES, ids=param_id)
def test_attention_split_context(num_splits, dtype, softcap, kind):
    """Flash-decoding: partial results over slices of the context, then combined; short
    contexts leave some splits empty (a context of 1 has keys in one split of 2, one of
    17 in two of 8)."""
    batch = make_batch(CHUNKS[kind](16), 16, 2, 3, 20, dtype, seed=num_splits)
    out = run_triton(batch, None, small_tiles(3, num_splits), softcap)
    expected = reference(batch, None, softcap)
    assert_close(out, expected, dtype, f"{kind}, {num_splits} splits")


# A window of the token alone, one shorter than a block, and one longer than a 16-key
# tile (whole tiles before it skipped); soft-capping on two of them: it bends the
# scores before the mask, whatever the window.
@pytest.mark.parametrize(("window", "softcap"), [(1, None), (7, SOFTCAP), (19, SOFTCAP)])
def test_attention_sliding_window(window, softcap):
    dtype = torch.float32
    batch = make_batch(mixed_chunks(16), 16, 1, 3, 20, dtype, seed=window)
    expected = reference(batch, window, softcap)
    for what, tiles in (
        ("device tiles", None),
        ("16-key tiles", small_tiles(3)),
        ("4 splits", small_tiles(3, num_splits=4)),
    ):
        assert_close(run_triton(batch, window, tiles, softcap), expected, dtype, what)


def test_attention_bf16_is_upcast():
    """bf16 arithmetic is wrong in the interpreter; the kernel must not do any."""
    dtype = torch.bfloat16
    batch = make_batch(mixed_chunks(16), 16, 1, 3, 24, dtype)
    assert_close(run_triton(batch, None), reference(batch, None), dtype)


def test_attention_strided_query():
    """A query that is a view with a token stride larger than heads * head_dim."""
    dtype = torch.float32
    batch = make_batch(mixed_chunks(16), 16, 2, 3, 24, dtype)
    wide = torch.zeros(batch.query.shape[0], 8, 24)
    wide[:, 1:7] = batch.query
    batch.query = wide[:, 1:7]
    assert not batch.query.is_contiguous()
    assert_close(run_triton(batch, None), reference(batch, None), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_store_kv_matches_reference_and_skips_padding(dtype, block_size):
    gen = torch.Generator().manual_seed(block_size)
    num_blocks, num_kv_heads, head_dim = 5, 3, 20
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(k_cache.shape, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:23]
    slots[[0, 5, 6, 22]] = -1  # padding tokens
    # value as the model passes it: a view into a merged qkv output
    qkv = torch.randn(23, 3 * num_kv_heads * head_dim, generator=gen).to(dtype)
    key = qkv[:, : num_kv_heads * head_dim].reshape(23, num_kv_heads, head_dim)
    value = qkv[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].view(
        23, num_kv_heads, head_dim
    )
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    store_kv_ref(key, value, expected_k, expected_v, slots)
    store_kv_triton(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k), (k_cache != expected_k).nonzero()[:10].tolist()
    assert torch.equal(v_cache, expected_v), (v_cache != expected_v).nonzero()[:10].tolist()


# A quantized cache (kernels/kv_quant.py): the kernel reads int8 rows with their scales
# (or fp8 values); expected is the fp32 reference on the same rows dequantized, after
# the reference's own store (the Triton store rounds ties away from zero, the torch one
# to even, so the two caches may differ by one step where a value sits on a tie).


def quantized_reference(batch: Batch, window: int | None, softcap: float | None) -> torch.Tensor:
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    store_kv_ref(batch.key, batch.value, k_cache, v_cache, batch.inputs.slot_mapping)
    meta = prepare_torch_attention(batch.inputs, k_cache.shape[1], {window})
    query = batch.query.float()  # the caches read as fp32 (int8 keys rotated back)
    return paged_attention_ref(query, k_cache, v_cache, meta, SCALE, window, softcap)


# (group, head_dim, window, num_splits, softcap): each head size (2 scales a row; 1)
# with plain, windowed and split reads, soft-capping on half of them so that it meets
# each head size and each of the three. The int8 reads are the same code in all.
INT8_CASES = [
    (1, 64, None, 1, None),
    (1, 64, 7, 1, SOFTCAP),
    (1, 64, None, 4, None),
    (3, 20, None, 1, SOFTCAP),
    (3, 20, 7, 1, None),
    (3, 20, None, 4, SOFTCAP),
]


@pytest.mark.parametrize(
    ("group", "head_dim", "window", "num_splits", "softcap"), INT8_CASES, ids=param_id
)
def test_int8_cache_matches_dequantized_reference(group, head_dim, window, num_splits, softcap):
    dtype = torch.float32
    for kind, chunks in (("decode", decode_chunks(16)), ("mixed", mixed_chunks(16))):
        batch = quantized(make_batch(chunks, 16, 2, group, head_dim, dtype, seed=group))
        out = run_triton(batch, window, small_tiles(group, num_splits), softcap)
        expected = quantized_reference(batch, window, softcap)
        # fp16's tolerance: the two stores' ties (one int8 step of one element)
        assert_close(out, expected, torch.float16, f"int8 {kind}")


@pytest.mark.parametrize("head_dim", [20, 64])  # one scale a row; one per 32 values
def test_int8_store_kv_matches_reference(head_dim):
    gen = torch.Generator().manual_seed(3)
    num_blocks, block_size, num_kv_heads = 5, 16, 3
    shape = (num_blocks, block_size, num_kv_heads, stored_head_size(head_dim, torch.int8))
    k_cache = torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8)
    v_cache = torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:23]
    slots[[0, 5, 22]] = -1  # padding tokens
    key = torch.randn(23, num_kv_heads, head_dim, generator=gen)
    value = torch.randn(23, num_kv_heads, head_dim, generator=gen)
    value[4] = 0.0  # a row of zeros: scale 0
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    store_kv_ref(key, value, expected_k, expected_v, slots)
    store_kv_triton(key, value, k_cache, v_cache, slots)
    for actual, expected in ((k_cache, expected_k), (v_cache, expected_v)):
        # scales to the bit; values within one step (ties round the other way)
        assert torch.equal(actual[..., head_dim:], expected[..., head_dim:])
        steps = (actual[..., :head_dim].int() - expected[..., :head_dim].int()).abs()
        assert int(steps.max()) <= 1 and int((steps > 0).sum()) <= 2
