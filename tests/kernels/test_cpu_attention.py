"""The CPU attention path against the torch reference.

The C++ decode kernel is checked against ``decode_attention_ref`` and against the
padded reference (``paged_attention_ref``), and the whole CPU path (per-token rows,
or the tiled kernel for bf16 prefill chunks beside the decode kernel) against the
reference on mixed steps (the tiled kernel's AVX-512 code and, where the CPU has them,
AMX's tiles); each also with the scores soft-capped (Gemma 2). An int8
cache (kernels/kv_quant.py) is checked against the fp32 reference on its dequantized
values: decode rows, prefill chunks (by rows), sliding windows, soft-caps and GQA.
"""

from __future__ import annotations

import pytest
import torch
from hetero_infer.kernels import cpu_isa
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.kv_quant import stored_head_size
from hetero_infer.kernels.paged_attention import (
    decode_attention_ref,
    paged_attention_ref,
    prepare_torch_attention,
    store_kv_ref,
)
from hetero_infer.kernels.paged_attention_cpu import (
    cpu_attention,
    decode_attention_cpu,
    paged_attention_cpu,
    prepare_cpu_attention,
    tiled_kernel_serves,
)

from tests.kernels.batches import Batch, make_batch, quantized
from tests.kernels.checks import assert_close, refusals

SCALE = 0.3
# Scaled scores here are ~1.3 to ~3.4 (head_dim 20 to 128): a cap of 2 bends most.
SOFTCAPS = [None, 2.0]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
needs_tiled_kernel = pytest.mark.cpu_kernels("prefill_attention")


@pytest.fixture(scope="module")
def module():
    """The built extension, which every CPU kernel function takes."""
    if load_cpu_kernels() is None:
        pytest.skip("the C++ kernels did not build (test_kernel_builds_here says so)")
    return load_cpu_kernels()


@pytest.fixture(params=[False, True], ids=["avx512", "amx"])
def tiles(request, module):
    """The tiled prefill kernel's AVX-512 code, and its AMX tiles where the CPU has them
    (tests/kernels/test_cpu_isa.py says why not)."""
    if request.param and (reason := cpu_isa.kernel_unavailable("amx_tiles")) is not None:
        pytest.skip(reason)
    before = module.set_amx_tiles(request.param)
    yield request.param
    module.set_amx_tiles(before)


def padded_reference(
    batch: Batch, window: int | None, softcap: float | None = None
) -> torch.Tensor:
    """fp32 padded torch reference on the (already filled) cache, which it reads as fp32
    (dequantized, and an int8 cache's keys rotated back)."""
    meta = prepare_torch_attention(batch.inputs, batch.k_cache.shape[1], {window})
    query = batch.query.float()
    return paged_attention_ref(query, batch.k_cache, batch.v_cache, meta, SCALE, window, softcap)


def decode_batch(dtype: torch.dtype, block_size: int, num_kv_heads: int, group: int, head_dim: int):
    # Contexts on and off block boundaries, 1 token, and several blocks; the new key is
    # written so that the query sees it, as in a real step.
    bs = block_size
    chunks = [(0, 1), (bs - 1, 1), (bs, 1), (3 * bs + 5, 1), (7, 1), (9 * bs + 3, 1)]
    batch = make_batch(chunks, bs, num_kv_heads, group, head_dim, dtype, seed=group + head_dim)
    store_kv_ref(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.inputs.slot_mapping)
    return batch


def test_kernel_builds_here():
    # The machines we test on have a compiler: a silent fallback would hide a broken build.
    assert load_cpu_kernels() is not None


@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("block_size", "num_kv_heads", "group", "head_dim"),
    [
        (16, 1, 1, 64),
        (16, 3, 3, 64),
        (32, 2, 4, 20),
        (8, 1, 8, 128),
        (16, 2, 7, 12),
        # head dims a multiple of 16 but not 32, and GQA groups split 4 + 3 / 4 + 1
        (16, 2, 7, 48),
        (16, 1, 5, 96),
    ],
)
def test_decode_kernel_matches_references(
    module, dtype, block_size, num_kv_heads, group, head_dim, softcap
):
    batch = decode_batch(dtype, block_size, num_kv_heads, group, head_dim)
    inputs = batch.inputs
    caches = (batch.k_cache, batch.v_cache)
    args = (*caches, inputs.block_tables, inputs.context_lens, SCALE, None, softcap)
    actual = decode_attention_cpu(module, batch.query, *args)
    assert actual.dtype == dtype
    expected = padded_reference(batch, None, softcap)
    assert_close(actual, expected, dtype, "kernel vs padded reference")
    assert_close(decode_attention_ref(batch.query, *args), expected, dtype, "decode ref")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("num_kv_heads", "group", "head_dim"), [(3, 3, 64), (2, 7, 48), (4, 1, 20)]
)
@pytest.mark.parametrize("threads", [2, 3])
def test_one_sequence_split_by_heads_equals_the_batched_rows(
    module, dtype, num_kv_heads, group, head_dim, threads
):
    # With fewer sequences than threads, a sequence's KV groups are split among the
    # threads: each row must come out as it does when its sequence is one of many.
    batch = decode_batch(dtype, 16, num_kv_heads, group, head_dim)
    inputs = batch.inputs
    caches = (batch.k_cache, batch.v_cache)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together = decode_attention_cpu(
            module, batch.query, *caches, inputs.block_tables, inputs.context_lens, SCALE
        )
        for row in range(batch.query.shape[0]):
            alone = decode_attention_cpu(
                module,
                batch.query[row : row + 1],
                *caches,
                inputs.block_tables[row : row + 1],
                inputs.context_lens[row : row + 1],
                SCALE,
            )
            assert torch.equal(alone[0], together[row]), row
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("cache", ["model", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (1500, 30.0)])
def test_long_contexts_split_among_idle_threads(module, dtype, cache, window, softcap):
    """Fewer (sequence, KV head) items than threads and contexts of 512 keys a thread or
    more: each context is split into parts whose softmax partials are combined. Beside
    2,100 keys, 3 give parts with no key at all."""
    batch = make_batch([(2099, 1), (2, 1)], 16, 1, 4, 64, dtype, seed=21)
    if cache == "int8":
        batch = quantized(batch)
    store_kv_ref(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.inputs.slot_mapping)
    inputs = batch.inputs
    args = (batch.k_cache, batch.v_cache, inputs.block_tables, inputs.context_lens, SCALE)
    previous = torch.get_num_threads()
    torch.set_num_threads(4)  # 2 items: 4 parts of each
    try:
        actual = decode_attention_cpu(module, batch.query, *args, window, softcap)
    finally:
        torch.set_num_threads(previous)
    expected = padded_reference(batch, window, softcap)
    assert_close(actual, expected, dtype, "split contexts vs padded reference")


@pytest.mark.parametrize("window", [1, 5, 16, 40])
def test_decode_kernel_sliding_window(module, window):
    batch = decode_batch(torch.float32, 16, 2, 3, 24)
    inputs = batch.inputs
    args = (batch.k_cache, batch.v_cache, inputs.block_tables, inputs.context_lens, SCALE, window)
    expected = padded_reference(batch, window)
    actual = decode_attention_cpu(module, batch.query, *args)
    assert_close(actual, expected, torch.float32, "kernel")
    assert_close(decode_attention_ref(batch.query, *args), expected, torch.float32, "ref")


@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 6])
def test_cpu_path_on_mixed_steps(module, dtype, window, softcap):
    """Decodes, first prefill chunks, and chunks after cached context in one step."""
    bs = 16
    chunks = [(0, 7), (bs - 1, 1), (bs, 5), (2 * bs, 1), (bs + 1, 2 * bs + 3), (5, 1), (0, 1)]
    batch = make_batch(chunks, bs, 2, 3, 20, dtype, seed=3)
    store_kv_ref(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.inputs.slot_mapping)
    expected = padded_reference(batch, window, softcap)
    meta = prepare_cpu_attention(batch.inputs, bs, {window})
    # One kernel row per query token: a chunk's tokens see one more key each, ending at
    # the sequence's whole context.
    lens = meta.token_context_lens.tolist()
    assert len(lens) == sum(n for _, n in chunks)
    assert lens[:8] == [1, 2, 3, 4, 5, 6, 7, bs]
    assert lens[-1] == 1 and lens[-2] == 6
    caches = (batch.k_cache, batch.v_cache)
    actual = paged_attention_cpu(module, batch.query, *caches, meta, SCALE, window, softcap)
    assert_close(actual, expected, dtype, "cpu path")


# (dtype, block_size, num_kv_heads, group, head_dim): bf16's four head sizes, and fp32's
# from one vector of 16 to eight.
TILED_CASES = [
    (torch.bfloat16, 16, 3, 3, 64),
    (torch.bfloat16, 32, 2, 4, 32),
    (torch.bfloat16, 16, 1, 7, 96),
    (torch.bfloat16, 8, 2, 1, 128),
    (torch.float32, 16, 2, 2, 16),
    (torch.float32, 32, 2, 4, 32),
    (torch.float32, 16, 1, 7, 48),
    (torch.float32, 8, 3, 3, 64),
    (torch.float32, 16, 2, 1, 128),
]


@needs_tiled_kernel
@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize(("dtype", "block_size", "num_kv_heads", "group", "head_dim"), TILED_CASES)
def test_tiled_prefill_kernel_on_mixed_steps(
    module, tiles, dtype, block_size, num_kv_heads, group, head_dim, softcap
):
    """Chunks by the tiled kernel: first chunks, chunks after cached context (on and
    off tile and block boundaries), a 2-token chunk, with decodes between them."""
    bs = block_size
    chunks = [(0, 37), (bs - 1, 1), (21, 50), (0, 2), (3 * bs, 16), (5, 1), (0, 1), (40, 17)]
    batch = make_batch(chunks, bs, num_kv_heads, group, head_dim, dtype, seed=11)
    store_kv_ref(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.inputs.slot_mapping)
    expected = padded_reference(batch, None, softcap)
    meta = prepare_cpu_attention(batch.inputs, bs, {None})
    assert tiled_kernel_serves(module, batch.query, batch.k_cache, None)
    assert meta.prefill_chunks.lens.tolist() == [37, 50, 2, 16, 17]
    caches = (batch.k_cache, batch.v_cache)
    actual = paged_attention_cpu(module, batch.query, *caches, meta, SCALE, softcap=softcap)
    assert_close(actual, expected, dtype, "tiled kernel")


@needs_tiled_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tiled_prefill_kernel_on_one_long_chunk(module, tiles, dtype):
    # One chunk is split among the threads by its query tiles, not given to one thread.
    batch = make_batch([(100, 300)], 16, 3, 3, 64, dtype, seed=12)
    store_kv_ref(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.inputs.slot_mapping)
    expected = padded_reference(batch, None)
    meta = prepare_cpu_attention(batch.inputs, 16, {None})
    actual = paged_attention_cpu(module, batch.query, batch.k_cache, batch.v_cache, meta, SCALE)
    assert_close(actual, expected, dtype, "one long chunk")


@needs_tiled_kernel
def test_tiled_kernel_serves_bf16_and_fp32_without_window_only(module):
    query = torch.empty(4, 2, 64, dtype=torch.bfloat16)
    cache = torch.empty(3, 16, 2, 64, dtype=torch.bfloat16)
    assert tiled_kernel_serves(module, query, cache, None)
    assert not tiled_kernel_serves(module, query, cache, 8)
    assert tiled_kernel_serves(module, query.float(), cache.float(), None)
    assert not tiled_kernel_serves(module, query.half(), cache.half(), None)
    assert not tiled_kernel_serves(module, query.float(), cache, None)  # dtypes differ
    odd = torch.empty(4, 2, 20, dtype=torch.bfloat16)
    assert not tiled_kernel_serves(module, odd, cache, None)
    assert not tiled_kernel_serves(module, odd.float(), cache.float(), None)
    # 16 values a head: fp32's one vector; bf16's products take pairs of 16
    small = torch.empty(4, 2, 16)
    assert tiled_kernel_serves(module, small, torch.empty(3, 16, 2, 16), None)
    assert not tiled_kernel_serves(module, small.bfloat16(), cache, None)
    # an int8 cache's chunks go row by row
    int8_cache = torch.empty(3, 16, 2, 64 + 4, dtype=torch.int8)
    assert not tiled_kernel_serves(module, query, int8_cache, None)


def test_cpu_path_decodes_only(module):
    batch = decode_batch(torch.float32, 16, 3, 3, 64)
    expected = padded_reference(batch, None)
    meta = prepare_cpu_attention(batch.inputs, 16, {None})
    assert meta.token_context_lens.tolist() == meta.context_lens.tolist()
    actual = paged_attention_cpu(module, batch.query, batch.k_cache, batch.v_cache, meta, SCALE)
    assert_close(actual, expected, torch.float32, "decodes only")


@pytest.mark.parametrize("cache", ["model", "int8"])
@pytest.mark.parametrize("head_dim", [20, 64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_skips_padding_slots(module, dtype, head_dim, cache):
    """Every token's rows land in their slots, byte for byte as the reference stores
    them (an int8 cache's rows quantized, and rotated where the keys are: 64), but the
    padding's."""
    bs = 16
    batch = make_batch([(0, 7), (bs - 1, 1), (3, 20)], bs, 2, 3, head_dim, dtype, seed=5)
    if cache == "int8":
        batch = quantized(batch)
    slots = batch.inputs.slot_mapping.clone()
    slots[[3, 9]] = -1  # padding rows: nothing stored
    # value as a view with strided rows, as the model's merged projection gives it
    rows = torch.cat([batch.value.flatten(1), batch.key.flatten(1)], dim=1)
    value = rows[:, : 2 * head_dim].view(-1, 2, head_dim)
    k_ref, v_ref = batch.k_cache.clone(), batch.v_cache.clone()
    store_kv_ref(batch.key, value, k_ref, v_ref, slots)
    k_out, v_out = batch.k_cache.clone(), batch.v_cache.clone()
    cpu_attention(module).store_kv(batch.key, value, k_out, v_out, slots)
    assert torch.equal(k_out, k_ref) and torch.equal(v_out, v_ref)


def store_kv_arguments(case: str) -> tuple[torch.Tensor, ...]:
    """store_kv's arguments (key, value, k_cache, v_cache, slot_mapping) for 4 tokens of
    2 KV heads of 8 values, one of them made as the kernel cannot take it (``case``)."""
    key, value = torch.zeros(4, 2, 8), torch.zeros(4, 2, 8)
    k_cache, v_cache = torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8)
    slots = torch.arange(4)
    int8_cache = torch.zeros(2, 4, 2, stored_head_size(8, torch.int8), dtype=torch.int8)
    match case:
        case "2-d key":
            key = key.flatten(1)
        case "strided key values":
            key = torch.zeros(4, 2, 16)[:, :, ::2]
        case "key heads apart":
            key = torch.zeros(4, 2, 10)[:, :, :8]
        case "strided value values":
            value = torch.zeros(4, 2, 16)[:, :, ::2]
        case "value heads apart":
            value = torch.zeros(4, 2, 10)[:, :, :8]
        case "strided k cache":
            k_cache = torch.zeros(2, 4, 2, 16)[..., ::2]
        case "strided v cache":
            v_cache = torch.zeros(2, 4, 2, 16)[..., ::2]
        case "int32 slots":
            slots = slots.int()
        case "strided slots":
            slots = torch.arange(8)[::2]
        case "int8 k cache, float v cache":
            k_cache = int8_cache
        case "int8 cache, keys and values of two dtypes":
            k_cache, v_cache, value = int8_cache, int8_cache.clone(), value.half()
        case "int8 cache, rows of another size":
            k_cache = v_cache = torch.zeros(2, 4, 2, 8, dtype=torch.int8)
        case "key of another dtype than its cache":
            key = key.half()
        case "value of another dtype than its cache":
            value = value.half()
    return key, value, k_cache, v_cache, slots


STORE_KV_REFUSALS = {
    "key/value must be \\[tokens, kv_heads, head_dim\\] with contiguous heads": [
        "2-d key",
        "strided key values",
        "key heads apart",
        "strided value values",
        "value heads apart",
    ],
    "caches must be contiguous": ["strided k cache", "strided v cache"],
    "slot_mapping must be contiguous int64": ["int32 slots", "strided slots"],
    "an int8 cache holds rows of head_dim values and their fp16 scales": [
        "int8 k cache, float v cache",
        "int8 cache, keys and values of two dtypes",
        "int8 cache, rows of another size",
    ],
    "key/value and cache dtypes differ": [
        "key of another dtype than its cache",
        "value of another dtype than its cache",
    ],
}


@pytest.mark.parametrize(("case", "message"), refusals(STORE_KV_REFUSALS))
def test_store_kv_refuses_what_it_cannot_copy(module, case, message):
    with pytest.raises(RuntimeError, match=message):
        module.store_kv(*store_kv_arguments(case))
    module.store_kv(*store_kv_arguments("none"))  # the same, made as it takes them


def decode_attention_arguments(case: str) -> tuple:
    """decode_attention's arguments for 2 sequences of 4 query heads of 8 values over 2
    KV heads in blocks of 16, one of them made as the kernel cannot take it (``case``)."""
    query = torch.zeros(2, 4, 8)
    k_cache, v_cache = torch.zeros(3, 16, 2, 8), torch.zeros(3, 16, 2, 8)
    tables = torch.tensor([[0], [1]], dtype=torch.int32)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    int8_rows = stored_head_size(8, torch.int8)
    match case:
        case "int8 cache":  # taken
            k_cache = torch.zeros(3, 16, 2, int8_rows, dtype=torch.int8)
            v_cache = k_cache.clone()
        case "2-d query":
            query = query.flatten(1)
        case "3-d cache":
            k_cache = k_cache.flatten(2)
        case "strided k cache":
            k_cache = torch.zeros(3, 16, 2, 16)[..., ::2]
        case "strided v cache":
            v_cache = torch.zeros(3, 16, 2, 16)[..., ::2]
        case "query of another dtype":
            query = query.half()
        case "v cache of another dtype":
            v_cache = v_cache.half()
        case "int8 k cache, float v cache":
            k_cache = torch.zeros(3, 16, 2, int8_rows, dtype=torch.int8)
        case "3 heads over 2":
            query = torch.zeros(2, 3, 8)
        case "rows of 9":
            k_cache, v_cache = torch.zeros(3, 16, 2, 9), torch.zeros(3, 16, 2, 9)
        case "int8 rows without scales":
            k_cache = torch.zeros(3, 16, 2, 8, dtype=torch.int8)
            v_cache = k_cache.clone()
        case "int64 tables":
            tables = tables.long()
        case "int64 lengths":
            lens = lens.long()
    return query, k_cache, v_cache, tables, lens, 1.0, 0, 0.0


DECODE_ATTENTION_REFUSALS = {
    r"query \[seqs, heads, dim\], cache 4-D": ["2-d query", "3-d cache"],
    "caches must be contiguous": ["strided k cache", "strided v cache"],
    "query and cache dtypes differ": ["query of another dtype"],
    "key and value caches' dtypes differ": [
        "v cache of another dtype",
        "int8 k cache, float v cache",
    ],
    "heads must be a multiple of KV heads": ["3 heads over 2"],
    "the cache's rows must be head_dim values": ["rows of 9", "int8 rows without scales"],
    "block_tables and context_lens must be int32": ["int64 tables", "int64 lengths"],
}


@pytest.mark.parametrize(("case", "message"), refusals(DECODE_ATTENTION_REFUSALS))
def test_decode_attention_refuses_what_it_cannot_read(module, case, message):
    with pytest.raises(RuntimeError, match=message):
        module.decode_attention(*decode_attention_arguments(case))
    for taken in ("none", "int8 cache"):  # the same, made as it takes them
        module.decode_attention(*decode_attention_arguments(taken))


def prefill_attention_arguments(case: str) -> tuple:
    """prefill_attention's arguments for a chunk of 4 tokens of 4 query heads of 32
    values over 2 KV heads in blocks of 16, fp32, one of them made as the kernel cannot
    take it (``case``)."""

    def of(head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """query, out, k_cache and v_cache of ``head_dim`` values in ``dtype``."""
        rows = torch.zeros(4, 4, head_dim, dtype=dtype)
        cache = torch.zeros(3, 16, 2, head_dim, dtype=dtype)
        return rows, rows.clone(), cache, cache.clone()

    query, out, k_cache, v_cache = of(32, torch.float32)
    ints = {name: torch.tensor(value, dtype=torch.int32) for name, value in
            (("tables", [[0]]), ("lens", [4]), ("starts", [0]), ("chunk lens", [4]))}  # fmt: skip
    match case:
        case "bf16":  # taken
            query, out, k_cache, v_cache = of(32, torch.bfloat16)
        case "fp16":
            query, out, k_cache, v_cache = of(32, torch.float16)
        case "bf16 query":
            query = query.bfloat16()
        case "bf16 k cache":
            k_cache = k_cache.bfloat16()
        case "bf16 v cache":
            v_cache = v_cache.bfloat16()
        case "bf16 out":
            out = out.bfloat16()
        case "2-d query":
            query = query.flatten(1)
        case "strided query values":
            query = torch.zeros(4, 4, 64)[..., ::2]
        case "query heads apart":
            query = torch.zeros(4, 4, 40)[..., :32]
        case "strided out":
            out = torch.zeros(4, 4, 64)[..., ::2]
        case "out of another shape":
            out = torch.zeros(3, 4, 32)
        case "strided k cache":
            k_cache = torch.zeros(3, 16, 2, 64)[..., ::2]
        case "strided v cache":
            v_cache = torch.zeros(3, 16, 2, 64)[..., ::2]
        case "fp32 head_dim 24":
            query, out, k_cache, v_cache = of(24, torch.float32)
        case "fp32 head_dim 144":
            query, out, k_cache, v_cache = of(144, torch.float32)
        case "bf16 head_dim 48":
            query, out, k_cache, v_cache = of(48, torch.bfloat16)
        case "3 heads over 2":
            query, out = torch.zeros(4, 3, 32), torch.zeros(4, 3, 32)
        case "int64 tables" | "int64 lens" | "int64 starts" | "int64 chunk lens":
            name = case.removeprefix("int64 ")
            ints[name] = ints[name].long()
    return query, k_cache, v_cache, *ints.values(), 1.0, 0.0, out


PREFILL_ATTENTION_REFUSALS = {
    "bf16 or fp32, query, caches and out alike": [
        "fp16",
        "bf16 query",
        "bf16 k cache",
        "bf16 v cache",
        "bf16 out",
    ],
    r"query \[tokens, heads, dim\] with contiguous heads; out like it, contiguous": [
        "2-d query",
        "strided query values",
        "query heads apart",
        "strided out",
        "out of another shape",
    ],
    "caches must be contiguous": ["strided k cache", "strided v cache"],
    "head_dim 32, 64, 96 or 128": ["fp32 head_dim 24", "fp32 head_dim 144", "bf16 head_dim 48"],
    "heads a multiple of KV heads": ["3 heads over 2"],
    "block_tables, context_lens, chunk_starts and chunk_lens must be int32": [
        "int64 tables",
        "int64 lens",
        "int64 starts",
        "int64 chunk lens",
    ],
}


@needs_tiled_kernel
@pytest.mark.parametrize(("case", "message"), refusals(PREFILL_ATTENTION_REFUSALS))
def test_prefill_attention_refuses_what_it_cannot_read(module, case, message):
    with pytest.raises(RuntimeError, match=message):
        module.prefill_attention(*prefill_attention_arguments(case))
    for taken in ("none", "bf16"):  # the same, made as it takes them
        module.prefill_attention(*prefill_attention_arguments(taken))


# The int8 cache: the kernel reads int8 rows and their groups' scales; the reference
# attends in fp32 over the same rows dequantized, so only the order of rounding
# differs: each query dtype's own tolerance. Head sizes of one group of 32 per 16 and
# 32 values (64, 128, 256) and of one scale per row (48, 20).
INT8_TOLERANCE_DTYPE = {torch.float32: torch.float32, torch.bfloat16: torch.bfloat16}


def int8_batch(chunks, block_size, num_kv_heads, group, head_dim, dtype, seed) -> Batch:
    batch = quantized(make_batch(chunks, block_size, num_kv_heads, group, head_dim, dtype, seed))
    store_kv_ref(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.inputs.slot_mapping)
    return batch


@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("block_size", "num_kv_heads", "group", "head_dim"),
    [(16, 3, 3, 64), (16, 2, 7, 48), (8, 1, 8, 128), (32, 2, 4, 20), (16, 1, 1, 256)],
)
def test_int8_decode_kernel_matches_dequantized_reference(
    module, dtype, block_size, num_kv_heads, group, head_dim, window, softcap
):
    bs = block_size
    chunks = [(0, 1), (bs - 1, 1), (bs, 1), (3 * bs + 5, 1), (7, 1), (9 * bs + 3, 1)]
    batch = int8_batch(chunks, bs, num_kv_heads, group, head_dim, dtype, seed=head_dim)
    assert batch.k_cache.dtype == torch.int8
    assert batch.k_cache.shape[-1] == stored_head_size(head_dim, torch.int8)
    inputs = batch.inputs
    args = (batch.k_cache, batch.v_cache, inputs.block_tables, inputs.context_lens, SCALE)
    actual = decode_attention_cpu(module, batch.query, *args, window, softcap)
    assert actual.dtype == dtype
    expected = padded_reference(batch, window, softcap)
    tolerance = INT8_TOLERANCE_DTYPE[dtype]
    assert_close(actual, expected, tolerance, "int8 kernel vs dequantized reference")
    reference = decode_attention_ref(batch.query, *args, window, softcap)
    assert_close(reference, expected, tolerance, "int8 decode ref")


@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_cpu_path_on_mixed_steps(module, dtype, window, softcap):
    """Prefill chunks (first ones and ones after cached context) beside decodes: with an
    int8 cache every token goes through the row kernel, the tiled kernel's fallback."""
    bs = 16
    chunks = [(0, 37), (bs - 1, 1), (21, 50), (0, 2), (3 * bs, 16), (5, 1), (40, 17)]
    batch = int8_batch(chunks, bs, 3, 3, 64, dtype, seed=13)
    meta = prepare_cpu_attention(batch.inputs, bs, {window})
    assert not tiled_kernel_serves(module, batch.query, batch.k_cache, window)
    caches = (batch.k_cache, batch.v_cache)
    actual = paged_attention_cpu(module, batch.query, *caches, meta, SCALE, window, softcap)
    expected = padded_reference(batch, window, softcap)
    assert_close(actual, expected, INT8_TOLERANCE_DTYPE[dtype], "int8 cpu path")


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_store_kv_quantizes_as_the_reference(module, dtype):
    # The C++ store rounds as torch does (half to even), so the bytes are the same:
    # values and scales, padding slots skipped, strided value rows read right.
    bs = 16
    batch = quantized(make_batch([(0, 7), (bs - 1, 1), (3, 20)], bs, 2, 3, 64, dtype, seed=5))
    slots = batch.inputs.slot_mapping.clone()
    slots[[0, 9]] = -1
    rows = torch.cat([batch.value.flatten(1), batch.key.flatten(1)], dim=1)
    value = rows[:, : 2 * 64].view(-1, 2, 64)
    value[3] = 0  # a row of zeros: scale 0, values 0
    k_ref, v_ref = batch.k_cache.clone(), batch.v_cache.clone()
    store_kv_ref(batch.key, value, k_ref, v_ref, slots)
    k_out, v_out = batch.k_cache.clone(), batch.v_cache.clone()
    cpu_attention(module).store_kv(batch.key, value, k_out, v_out, slots)
    assert torch.equal(k_out, k_ref) and torch.equal(v_out, v_ref)
