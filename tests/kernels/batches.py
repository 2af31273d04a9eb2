"""Made-up attention steps over a noisy paged cache, shared by the attention tests.

Each sequence's blocks sit at shuffled physical positions of a cache filled with
noise, so a wrong gather or a missing mask shows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from hetero_infer.kernels.attention_backend import AttentionInputs
from hetero_infer.kernels.kv_quant import to_cache


@dataclass
class Batch:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]: this step's new keys
    value: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    inputs: AttentionInputs  # what each backend prepares its metadata from


def make_batch(
    chunks: list[tuple[int, int]],
    block_size: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int = 0,
) -> Batch:
    """chunks: (tokens cached before this step, new tokens this step) per sequence.

    The cached part is written into the cache here; the new part is for store_kv.
    """
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    needed = sum(-(-(cached + new) // block_size) for cached, new in chunks)
    num_blocks = needed + 3  # spare blocks of noise
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables, slots, starts, context_lens, keys, values = [], [], [0], [], [], []
    for cached, new in chunks:
        total = cached + new
        table = [free.pop() for _ in range(-(-total // block_size))]
        k = torch.randn(total, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(total, num_kv_heads, head_dim, generator=gen).to(dtype)
        for p in range(cached):
            k_cache[table[p // block_size], p % block_size] = k[p]
            v_cache[table[p // block_size], p % block_size] = v[p]
        slots += [
            table[p // block_size] * block_size + p % block_size for p in range(cached, total)
        ]
        keys.append(k[cached:])
        values.append(v[cached:])
        tables.append(table)
        starts.append(starts[-1] + new)
        context_lens.append(total)
    max_blocks = max(len(t) for t in tables)
    inputs = AttentionInputs(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor(
            [t + [0] * (max_blocks - len(t)) for t in tables], dtype=torch.int32
        ),
        context_lens=torch.tensor(context_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        max_query_len=max(new for _, new in chunks),
        max_context_len=max(context_lens),
    )
    query = torch.randn(starts[-1], num_kv_heads * group, head_dim, generator=gen).to(dtype)
    return Batch(query, torch.cat(keys), torch.cat(values), k_cache, v_cache, inputs)


def quantized(batch: Batch, cache_dtype: torch.dtype = torch.int8) -> Batch:
    """The batch with its cache (noise and cached tokens) as a quantized cache of
    ``cache_dtype`` stores it (kernels/kv_quant.py); the step's new keys and values stay
    as they are, for store_kv to quantize."""
    return Batch(
        batch.query,
        batch.key,
        batch.value,
        to_cache(batch.k_cache, cache_dtype),
        to_cache(batch.v_cache, cache_dtype),
        batch.inputs,
    )
