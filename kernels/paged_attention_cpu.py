"""Paged attention on the CPU: every query token as its own row of the C++ kernel.

A step mixes decodes (one query token) with prefill chunks (many). Query token t of a
sequence sees the sequence's keys at positions 0 .. pos(t), all in the cache by the
time attention runs (the step's keys are stored first). So each token is a "decode"
of its own: the sequence's block table with a context of pos(t) + 1 keys. One call of
kernels/csrc/paged_attention_cpu.cpp then serves the whole step, reading every key and
value row straight from its block, with no padding to the longest chunk and no work
past the causal diagonal (torch's padded attention computed both). A prompt's rows
are re-read by each of its tokens, from the core's cache, since a 512-token prompt's
keys and values take a few hundred KB per layer.

``prepare_cpu_attention`` builds those per-token rows once per step, for all layers.
Where the C++ kernels cannot be built (kernels/cpu_extension.py), the padded torch
reference runs instead, with the same results, more slowly.
"""

from __future__ import annotations

import torch

from kernels.cpu_extension import cpu_kernels
from kernels.paged_attention import (
    AttentionMetadata,
    decode_attention_ref,
    paged_attention_ref,
    prepare_torch_attention,
)


def decode_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Same contract as ``decode_attention_ref``; by the C++ kernel where it is built."""
    module = cpu_kernels()
    if module is None:
        return decode_attention_ref(
            query, k_cache, v_cache, block_tables, context_lens, scale, sliding_window
        )
    return module.decode_attention(
        query, k_cache, v_cache, block_tables, context_lens, scale, sliding_window or 0
    )


def prepare_cpu_attention(
    meta: AttentionMetadata, block_size: int, sliding_windows: set[int | None]
) -> None:
    """Each query token's block table and visible context, once for all layers (or the
    torch reference's masks where the kernel is not built)."""
    if cpu_kernels() is None:
        prepare_torch_attention(meta, block_size, sliding_windows)
        return
    ends = meta.query_start_loc[1:].long()
    query_lens = ends - meta.query_start_loc[:-1].long()
    num_tokens = int(ends[-1])
    seq_of_token = torch.repeat_interleave(torch.arange(meta.num_seqs), query_lens)
    # The last token of a chunk sees the whole context; each earlier one, one key less.
    token = torch.arange(num_tokens)
    visible = meta.context_lens.long()[seq_of_token] - (ends[seq_of_token] - 1 - token)
    meta.token_block_tables = meta.block_tables.index_select(0, seq_of_token)
    meta.token_context_lens = visible.to(torch.int32)


def paged_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Same contract as ``paged_attention_ref``, for metadata from prepare_cpu_attention."""
    if meta.token_context_lens is None:  # no C++ kernel: the padded torch reference
        return paged_attention_ref(query, k_cache, v_cache, meta, scale, sliding_window)
    return decode_attention_cpu(
        query,
        k_cache,
        v_cache,
        meta.token_block_tables,
        meta.token_context_lens,
        scale,
        sliding_window,
    )
