"""Prefill chunks by matrix products (kernels/prefill_attention_matmul.py), for CPUs
without the tiled kernel, against the padded fp32 reference: one chunk at a time, and
the CPU path's split of a step between the products and the per-token rows."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.kernels import paged_attention_cpu as cpu_path
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.paged_attention import store_kv_ref
from hetero_infer.kernels.paged_attention_cpu import (
    MATMUL_FROM_PAIRS,
    paged_attention_cpu,
    prepare_cpu_attention,
)
from hetero_infer.kernels.prefill_attention_matmul import QUERY_BLOCK, chunk_attention

from tests.kernels.batches import make_batch, quantized
from tests.kernels.checks import assert_close
from tests.kernels.test_cpu_attention import SCALE, SOFTCAPS, padded_reference


@pytest.fixture(scope="module")
def module():
    if load_cpu_kernels() is None:
        pytest.skip("the C++ kernels did not build (test_kernel_builds_here says so)")
    return load_cpu_kernels()


class WithoutTiledKernel:
    """The built extension as a CPU without AVX-512 builds it: no tiled prefill kernel."""

    def __init__(self, module) -> None:
        self.module = module

    def __getattr__(self, name: str):
        return getattr(self.module, name)

    def prefill_attention_available(self) -> bool:
        return False


@pytest.fixture
def chunks_by_matmul(monkeypatch):
    """The (tokens, keys) of each chunk the CPU path gives to chunk_attention."""
    calls = []

    def counted(query, k_cache, v_cache, block_table, context_len, scale, softcap=None):
        calls.append((len(query), context_len))
        return chunk_attention(query, k_cache, v_cache, block_table, context_len, scale, softcap)

    monkeypatch.setattr(cpu_path, "chunk_attention", counted)
    return calls


@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("cached", "new"),
    # a short first chunk; two query blocks and a part; after cached context, off block
    # boundaries; one token, the first of a block (its keys one past two whole blocks)
    [(0, 7), (0, 2 * QUERY_BLOCK + 5), (100, QUERY_BLOCK + 1), (32, 1)],
)
@pytest.mark.parametrize(("num_kv_heads", "group", "head_dim"), [(2, 3, 20), (1, 7, 64)])
def test_one_chunk_matches_the_reference(
    cached, new, num_kv_heads, group, head_dim, dtype, softcap
):
    batch = make_batch([(cached, new)], 16, num_kv_heads, group, head_dim, dtype, seed=new)
    store_kv_ref(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.inputs.slot_mapping)
    expected = padded_reference(batch, None, softcap)
    table = batch.inputs.block_tables[0]
    actual = chunk_attention(
        batch.query, batch.k_cache, batch.v_cache, table, cached + new, SCALE, softcap
    )
    assert actual.dtype == dtype
    assert_close(actual, expected, dtype, "matrix products")


# A step of decodes, short chunks, a chunk of many keys (100 cached, 300 new: 75k
# query-key pairs) and one just under MATMUL_FROM_PAIRS (150 new: 11k).
BS = 16
MIXED = [(0, 7), (BS - 1, 1), (100, 300), (0, 150), (5, 1), (3 * BS, 20)]


@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_step_without_the_tiled_kernel_splits_its_chunks(
    module, chunks_by_matmul, dtype, softcap
):
    batch = make_batch(MIXED, BS, 3, 3, 64, dtype, seed=5)
    store_kv_ref(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.inputs.slot_mapping)
    meta = prepare_cpu_attention(batch.inputs, BS, {None})
    assert 150 * (150 - 149 / 2) < MATMUL_FROM_PAIRS <= 300 * (400 - 299 / 2)
    [(start, tokens, context_len, table)] = meta.prefill_chunks.matmul_chunks
    assert (start, tokens, context_len) == (8, 300, 400)
    assert torch.equal(table, batch.inputs.block_tables[2])
    others = [*range(8), *range(308, len(batch.query))]
    assert meta.prefill_chunks.rows_beside_matmul.tolist() == others

    caches = (batch.k_cache, batch.v_cache)
    without = WithoutTiledKernel(module)
    actual = paged_attention_cpu(without, batch.query, *caches, meta, SCALE, softcap=softcap)
    assert chunks_by_matmul == [(300, 400)]
    assert_close(actual, padded_reference(batch, None, softcap), dtype, "products and rows")


@pytest.mark.parametrize(("cached", "by_products"), [(63, False), (64, True)])
def test_a_chunk_goes_to_the_products_from_its_query_key_pairs(cached, by_products):
    """128 new tokens see 128.5 keys each on average after 64 cached ones, 127.5 after
    63: 16,448 and 16,320 query-key pairs, either side of MATMUL_FROM_PAIRS."""
    assert 128 * (63 + 128 - 127 / 2) < MATMUL_FROM_PAIRS <= 128 * (64 + 128 - 127 / 2)
    batch = make_batch([(cached, 128)], BS, 1, 1, 16, torch.float32)
    chunks = prepare_cpu_attention(batch.inputs, BS, {None}).prefill_chunks
    assert [tokens for _, tokens, _, _ in chunks.matmul_chunks] == ([128] if by_products else [])


def test_windows_int8_caches_and_the_tiled_kernel_keep_their_paths(module, chunks_by_matmul):
    batch = make_batch(MIXED, BS, 3, 3, 64, torch.float32, seed=6)
    store_kv_ref(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.inputs.slot_mapping)
    meta = prepare_cpu_attention(batch.inputs, BS, {None, 6})
    caches = (batch.k_cache, batch.v_cache)
    # A sliding window: every token a row.
    actual = paged_attention_cpu(WithoutTiledKernel(module), batch.query, *caches, meta, SCALE, 6)
    assert_close(actual, padded_reference(batch, 6), torch.float32, "window")
    # An int8 cache: its keys are not in the query's dtype.
    int8 = quantized(batch)
    int8_caches = (int8.k_cache, int8.v_cache)
    actual = paged_attention_cpu(WithoutTiledKernel(module), int8.query, *int8_caches, meta, SCALE)
    assert_close(actual, padded_reference(int8, None), torch.float32, "int8 cache")
    assert chunks_by_matmul == []
    # The built extension: where it has the tiled kernel, that takes the chunks.
    actual = paged_attention_cpu(module, batch.query, *caches, meta, SCALE)
    tiled = module.prefill_attention_available()
    assert chunks_by_matmul == ([] if tiled else [(300, 400)])
    assert_close(actual, padded_reference(batch, None), torch.float32, "this CPU's path")
