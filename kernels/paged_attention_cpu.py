"""Paged attention on the CPU: decodes by a C++ kernel, prefill chunks by torch.

A step mixes decodes (one query token) with prefill chunks (many). Padding them all to
the longest chunk, as the torch reference does, would make every decode pay for the
longest prompt, so the step is split once (``prepare_cpu_attention``): decodes run
through kernels/csrc/paged_attention_cpu.cpp, which reads each cached key and value
row once from its block, and the prefill chunks through the padded torch path, padded
only among themselves.

Where the C++ kernels cannot be built (kernels/cpu_extension.py), decodes run through
``decode_attention_ref``, which gives the same results more slowly.
"""

from __future__ import annotations

import torch

from kernels.cpu_extension import cpu_kernels
from kernels.paged_attention import (
    AttentionMetadata,
    decode_attention_ref,
    fill_padded_queries,
    paged_attention_ref,
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
    """Split the step into decodes and padded prefill chunks, once for all layers."""
    starts = meta.query_start_loc[:-1].long()
    query_lens = meta.query_start_loc[1:].long() - starts
    is_decode = query_lens == 1
    meta.decode_seqs = is_decode.nonzero().squeeze(1)
    meta.decode_tokens = starts[meta.decode_seqs]
    prefill_seqs = (~is_decode).nonzero().squeeze(1)
    if prefill_seqs.numel() == 0:
        return
    context_lens = meta.context_lens[prefill_seqs]
    max_context_len = int(context_lens.max())
    prefill = AttentionMetadata(
        slot_mapping=meta.slot_mapping,
        # Only as many block columns as the longest prefill needs: the masks scale with it.
        block_tables=meta.block_tables[prefill_seqs, : -(-max_context_len // block_size)],
        context_lens=context_lens,
        query_start_loc=meta.query_start_loc,
        max_query_len=int(query_lens[prefill_seqs].max()),
        max_context_len=max_context_len,
    )
    fill_padded_queries(
        prefill, starts[prefill_seqs], query_lens[prefill_seqs], block_size, sliding_windows
    )
    meta.prefill = prefill
    meta.prefill_tokens = prefill.query_index[prefill.query_valid]


def paged_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Same contract as ``paged_attention_ref``, for metadata from prepare_cpu_attention."""
    assert meta.decode_seqs is not None, "prepare_cpu_attention builds the step's split"
    if meta.prefill is None:  # decodes only: token i is sequence i's
        return decode_attention_cpu(
            query, k_cache, v_cache, meta.block_tables, meta.context_lens, scale, sliding_window
        )
    out = torch.empty_like(query)
    if meta.decode_seqs.numel():
        out[meta.decode_tokens] = decode_attention_cpu(
            query[meta.decode_tokens],
            k_cache,
            v_cache,
            meta.block_tables[meta.decode_seqs],
            meta.context_lens[meta.decode_seqs],
            scale,
            sliding_window,
        )
    out[meta.prefill_tokens] = paged_attention_ref(
        query, k_cache, v_cache, meta.prefill, scale, sliding_window
    )
    return out
