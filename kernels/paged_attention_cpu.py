"""Paged attention on the CPU, by the C++ kernels in kernels/csrc.

A step mixes decodes (one query token) with prefill chunks (many). Query token t of a
sequence sees the sequence's keys at positions 0 .. pos(t), all in the cache by the
time attention runs (the step's keys are stored first). Two kernels serve a step:

- paged_attention_cpu.cpp takes any token as a row of its own: the sequence's block
  table with a context of pos(t) + 1 keys. It serves the decodes, and every token
  where the tiled kernel does not apply (fp16, sliding windows, odd head sizes, an
  int8 cache: kernels/kv_quant.py, which it reads as stored).
- prefill_attention_cpu.cpp takes whole prefill chunks in bf16 and fp32: 16 query
  tokens at a time against 16 keys at a time, as small matrix products (flash
  attention), so a chunk's keys are read once per 16 tokens instead of once per token.
  It needs AVX-512: without it a chunk with enough query-key pairs
  (MATMUL_FROM_PAIRS) goes to torch's matrix products instead
  (kernels/prefill_attention_matmul.py), the rest row by row.

Neither pads to the longest chunk nor works past the causal diagonal, as torch's
padded attention does; both soft-cap the scores where asked (Gemma 2).
``prepare_cpu_attention`` builds the per-token rows and the chunk lists once per step,
for all layers. Each function takes the built extension (``module``,
kernels/cpu_extension.py); where it did not build, or is turned off, the engine runs
the torch backend instead (kernels/paged_attention.py), with the same results, more
slowly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
from hetero_infer.kernels.attention_backend import AttentionBackend, AttentionInputs
from hetero_infer.kernels.paged_attention import TorchAttentionMetadata, paged_attention_ref
from hetero_infer.kernels.prefill_attention_matmul import chunk_attention

# Head sizes the tiled kernel is built for, by dtype: bf16's in pairs of values (16
# pairs a vector), fp32's in one to eight vectors of 16 values.
TILED_HEAD_DIMS = {
    torch.bfloat16: (32, 64, 96, 128),
    torch.float32: (16, 32, 48, 64, 80, 96, 112, 128),
}
# A chunk's query-key pairs (its tokens times the keys each sees, on average) from which
# the matrix products outrun the rows, where the tiled kernel is not built: on 2 AVX2
# cores of an EPYC they break even at about 128 new tokens (8k pairs), 1.3-1.5x at 25k
# (100 tokens after 200), 1.8x at 512 new tokens (131k), 1.6-2.3x for 32 to 128 tokens
# after 2,000; below ~8k their fixed cost (~0.3 ms a chunk and layer) loses.
MATMUL_FROM_PAIRS = 16384


@dataclass
class PrefillChunks:
    """A step's prefill chunks (2+ query tokens), and its decode tokens beside them."""

    block_tables: torch.Tensor  # [num_chunks, max_blocks] int32
    context_lens: torch.Tensor  # [num_chunks] int32: keys after the step
    starts: torch.Tensor  # [num_chunks] int32: the chunk's first query row
    lens: torch.Tensor  # [num_chunks] int32: its query tokens
    decode_rows: torch.Tensor  # [num_decodes] long: query rows of the decode tokens
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks] int32: their tables
    decode_context_lens: torch.Tensor  # [num_decodes] int32
    # Where the tiled kernel is not built: (first query row, tokens, keys after the step,
    # block table) of the chunks with MATMUL_FROM_PAIRS query-key pairs or more, and the
    # query rows of every other token (decodes included), for the per-token rows.
    matmul_chunks: tuple[tuple[int, int, int, torch.Tensor], ...]
    rows_beside_matmul: torch.Tensor  # [tokens] long


@dataclass(frozen=True, eq=False)
class CpuAttentionMetadata(AttentionInputs):
    """The step's inputs, each query token's kernel row, and the prefill chunks."""

    token_block_tables: torch.Tensor  # [num_tokens, max_blocks] int32: each token's table
    token_context_lens: torch.Tensor  # [num_tokens] int32: the keys each token sees
    prefill_chunks: PrefillChunks | None  # None: the step has no prefill chunk


def decode_attention_cpu(
    module: ModuleType,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Same contract as ``decode_attention_ref``, by the C++ kernel."""
    return module.decode_attention(
        query,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        scale,
        sliding_window or 0,
        softcap or 0.0,
    )


def prepare_cpu_attention(
    inputs: AttentionInputs, block_size: int, sliding_windows: set[int | None]
) -> CpuAttentionMetadata:
    """Each query token's block table and visible context, and the prefill chunks, once
    for all layers (the kernels need neither the block size nor the windows here: they
    read the block tables, and take the window per call)."""
    # numpy, not torch: a torch op on these few values costs ~10 us, a numpy one ~1.
    query_start_loc = inputs.query_start_loc.numpy().astype(np.int64)
    starts, ends = query_start_loc[:-1], query_start_loc[1:]
    query_lens = ends - starts
    num_tokens = int(ends[-1])
    seq_of_token = np.repeat(np.arange(inputs.num_seqs), query_lens)
    # The last token of a chunk sees the whole context; each earlier one, one key less.
    context_lens = inputs.context_lens.numpy()
    visible = context_lens[seq_of_token] - (ends[seq_of_token] - 1 - np.arange(num_tokens))
    block_tables = inputs.block_tables.numpy()
    prefill_chunks = None
    is_chunk = query_lens > 1
    if is_chunk.any():
        chunks, decodes = np.flatnonzero(is_chunk), np.flatnonzero(~is_chunk)
        pairs = query_lens * (context_lens - (query_lens - 1) / 2)
        by_matmul = chunks[pairs[chunks] >= MATMUL_FROM_PAIRS]
        in_matmul = np.zeros(num_tokens, dtype=bool)
        for c in by_matmul:
            in_matmul[starts[c] : ends[c]] = True
        prefill_chunks = PrefillChunks(
            block_tables=torch.from_numpy(block_tables[chunks]),
            context_lens=torch.from_numpy(context_lens[chunks]),
            starts=torch.from_numpy(starts[chunks].astype(np.int32)),
            lens=torch.from_numpy(query_lens[chunks].astype(np.int32)),
            decode_rows=torch.from_numpy(starts[decodes]),
            decode_block_tables=torch.from_numpy(block_tables[decodes]),
            decode_context_lens=torch.from_numpy(context_lens[decodes]),
            matmul_chunks=tuple(
                (
                    int(starts[c]),
                    int(query_lens[c]),
                    int(context_lens[c]),
                    torch.from_numpy(block_tables[c]),
                )
                for c in by_matmul
            ),
            rows_beside_matmul=torch.from_numpy(np.flatnonzero(~in_matmul)),
        )
    return CpuAttentionMetadata(
        **inputs.common_fields(),
        token_block_tables=torch.from_numpy(block_tables[seq_of_token]),
        token_context_lens=torch.from_numpy(visible.astype(np.int32)),
        prefill_chunks=prefill_chunks,
    )


def tiled_kernel_serves(
    module: ModuleType, query: torch.Tensor, k_cache: torch.Tensor, sliding_window: int | None
) -> bool:
    # An int8 cache's prefill chunks go row by row: the tiled kernel's products take
    # keys in the query's dtype, and a chunk's keys converted per tile would cost what
    # the rows do. The tiles are built for bf16 and fp32; fp16 goes row by row.
    return (
        module.prefill_attention_available()
        and k_cache.dtype == query.dtype
        and query.shape[2] in TILED_HEAD_DIMS.get(query.dtype, ())
        and sliding_window is None
    )


def paged_attention_cpu(
    module: ModuleType,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: CpuAttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Same contract as ``paged_attention_ref``, for metadata from prepare_cpu_attention
    (or the reference's own, for a step only it serves: AttentionInputs.bidirectional_ends)."""
    if isinstance(meta, TorchAttentionMetadata):
        return paged_attention_ref(query, k_cache, v_cache, meta, scale, sliding_window, softcap)
    chunks = meta.prefill_chunks
    if (
        chunks is not None
        and chunks.matmul_chunks
        and not module.prefill_attention_available()
        and k_cache.dtype == query.dtype
        and sliding_window is None
    ):
        return matmul_and_rows(module, query, k_cache, v_cache, meta, scale, softcap)
    if chunks is None or not tiled_kernel_serves(module, query, k_cache, sliding_window):
        return decode_attention_cpu(
            module,
            query,
            k_cache,
            v_cache,
            meta.token_block_tables,
            meta.token_context_lens,
            scale,
            sliding_window,
            softcap,
        )
    out = torch.empty(query.shape, dtype=query.dtype)
    module.prefill_attention(
        query,
        k_cache,
        v_cache,
        chunks.block_tables,
        chunks.context_lens,
        chunks.starts,
        chunks.lens,
        scale,
        softcap or 0.0,
        out,
    )
    rows = chunks.decode_rows
    if rows.numel():
        out[rows] = decode_attention_cpu(
            module,
            query[rows],
            k_cache,
            v_cache,
            chunks.decode_block_tables,
            chunks.decode_context_lens,
            scale,
            softcap=softcap,
        )
    return out


def matmul_and_rows(
    module: ModuleType,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: CpuAttentionMetadata,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """paged_attention_cpu without the tiled kernel: the chunks with many query-key
    pairs by chunk_attention's matrix products, the other tokens as rows."""
    chunks = meta.prefill_chunks
    out = torch.empty(query.shape, dtype=query.dtype)
    for start, tokens, context_len, block_table in chunks.matmul_chunks:
        rows = slice(start, start + tokens)
        out[rows] = chunk_attention(
            query[rows], k_cache, v_cache, block_table, context_len, scale, softcap
        )
    rows = chunks.rows_beside_matmul
    if rows.numel():
        out[rows] = decode_attention_cpu(
            module,
            query[rows],
            k_cache,
            v_cache,
            meta.token_block_tables[rows],
            meta.token_context_lens[rows],
            scale,
            softcap=softcap,
        )
    return out


def cpu_attention(module: ModuleType) -> AttentionBackend[CpuAttentionMetadata]:
    """The C++ kernels of the built extension ``module`` as a backend, for CPU tensors."""
    forward = functools.partial(paged_attention_cpu, module)
    return AttentionBackend("cpu", prepare_cpu_attention, module.store_kv, forward)
