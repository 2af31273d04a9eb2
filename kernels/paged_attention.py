"""Attention over a paged KV cache, and the write of new keys/values into it.

The cache of one layer is two tensors [num_blocks, block_size, num_kv_heads, head_dim].
A sequence's token at position p lives in block ``block_table[p // block_size]`` at
offset ``p % block_size``; its flat slot is ``block * block_size + offset``.

One call serves a whole step: a batch of sequences, each with a chunk of new query
tokens (1 for a decode, many for a prefill chunk) that attends causally to everything
cached for that sequence, including the chunk itself:

    out[t] = softmax(scale * q[t] . K[:pos(t)+1]^T) V[:pos(t)+1]

or with a soft-cap c (Gemma 2) on the scaled scores s: softmax(c * tanh(s / c)).

A quantized cache (int8 rows with their scales, or fp8; kernels/kv_quant.py) is
written quantized by ``store_kv_ref`` and dequantized where attention gathers it.

The torch reference below pads the batch to [num_seqs, max_query_len] and gathers
each sequence's blocks into [num_seqs, max_context_len]: no Python loop over
sequences or layers. ``torch_attention()`` serves it to the model, with the masks
built once per step for all layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hetero_infer.kernels.attention_backend import AttentionBackend, AttentionInputs
from hetero_infer.kernels.kv_quant import from_cache, keys_from_cache, keys_to_cache, to_cache


@dataclass(frozen=True, eq=False)
class TorchAttentionMetadata(AttentionInputs):
    """The step's inputs and what the padded reference shares across layers."""

    query_valid: torch.Tensor  # [num_seqs, max_query_len] bool
    query_index: torch.Tensor  # [num_seqs, max_query_len] long
    # sliding window (None = full) -> [num_seqs, 1, max_query_len, max_ctx] bool
    attn_masks: dict[int | None, torch.Tensor]


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [num_tokens, num_kv_heads, head_dim] into their cache slots,
    quantized where the cache is."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    num_kv_heads, row = k_cache.shape[2:]
    key, value = keys_to_cache(key, k_cache.dtype), to_cache(value, v_cache.dtype)
    for new, cache in ((key, k_cache), (value, v_cache)):
        rows = cache.view(-1, num_kv_heads, row)
        if rows.element_size() == 1:  # index_copy_ has no fp8 kernel on the CPU: bytes
            new, rows = new.view(torch.uint8), rows.view(torch.uint8)
        rows.index_copy_(0, slot_mapping, new)


def prepare_torch_attention(
    inputs: AttentionInputs, block_size: int, sliding_windows: set[int | None]
) -> TorchAttentionMetadata:
    """The padded query index and the causal masks the torch path shares across layers
    (an image's tokens seeing each other both ways where ``bidirectional_ends`` says)."""
    starts = inputs.query_start_loc[:-1].long()
    query_lens = inputs.query_start_loc[1:].long() - starts  # [num_seqs]
    device = inputs.context_lens.device
    offsets = torch.arange(inputs.max_query_len, device=device)
    query_valid = offsets[None, :] < query_lens[:, None]
    query_index = torch.where(query_valid, starts[:, None] + offsets[None, :], 0)
    # Absolute position of each (padded) query token; padded rows still see key 0,
    # so no row of the mask is empty (an empty row would give NaN).
    query_pos = (inputs.context_lens.long() - query_lens)[:, None] + offsets[None, :]
    key_pos = torch.arange(inputs.block_tables.shape[1] * block_size, device=device)
    causal = key_pos[None, None, :] <= query_pos[:, :, None]
    if inputs.bidirectional_ends is not None:
        # An image's tokens see its later tokens too, within the window where there is
        # one (transformers' Gemma 3: AND(window, OR(causal, same image))).
        ends = torch.where(query_valid, inputs.bidirectional_ends.long()[query_index], 0)
        causal = causal | (key_pos[None, None, :] < ends[:, :, None])
    attn_masks = {}
    for window in sliding_windows:
        mask = causal
        if window is not None:
            mask = causal & (key_pos[None, None, :] > query_pos[:, :, None] - window)
            mask[..., 0] |= ~query_valid
        attn_masks[window] = mask.unsqueeze(1)
    return TorchAttentionMetadata(
        **inputs.common_fields(),
        query_valid=query_valid,
        query_index=query_index,
        attn_masks=attn_masks,
    )


def paged_attention_ref(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: TorchAttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """query [num_tokens, num_heads, head_dim] -> output of the same shape."""
    attn_mask = meta.attn_masks[sliding_window]
    num_seqs, max_blocks = meta.block_tables.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_heads, head_dim = query.shape[1:]
    # [num_seqs, num_kv_heads, max_ctx, head_dim]
    keys = keys_from_cache(k_cache[meta.block_tables], head_dim, query.dtype)
    values = from_cache(v_cache[meta.block_tables], head_dim, query.dtype)
    keys = keys.view(num_seqs, max_blocks * block_size, num_kv_heads, -1)
    values = values.view(num_seqs, max_blocks * block_size, num_kv_heads, -1)
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)
    # [num_seqs, num_heads, max_query_len, head_dim]
    q = query[meta.query_index].transpose(1, 2)
    if softcap is None:
        out = F.scaled_dot_product_attention(
            q,
            keys,
            values,
            attn_mask=attn_mask,
            scale=scale,
            enable_gqa=num_heads != num_kv_heads,
        )
    else:
        out = softcapped_attention(q, keys, values, attn_mask, scale, softcap)
    # back to the packed [num_tokens, num_heads, head_dim]
    return out.transpose(1, 2)[meta.query_valid]


def softcapped_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    attn_mask: torch.Tensor,
    scale: float,
    softcap: float,
) -> torch.Tensor:
    """scaled_dot_product_attention's result with the scaled scores soft-capped, which
    SDPA cannot do: transformers' eager attention for Gemma 2, op for op (the softmax in
    fp32). q [s, heads, n_q, dim], keys/values [s, kv_heads, n_ctx, dim]."""
    group = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, keys.transpose(2, 3)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(q.dtype), values)


def decode_attention_ref(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence: query [num_seqs, num_heads, head_dim]
    attends to the first context_lens[i] cached tokens of sequence i (the last
    ``sliding_window`` of them when set), its scores soft-capped at ``softcap`` when
    set. Returns the query's shape."""
    num_seqs, max_blocks = block_tables.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    head_dim = query.shape[2]
    group = query.shape[1] // num_kv_heads
    max_ctx = max_blocks * block_size
    flat_tables = block_tables.flatten().long()
    # [num_seqs, max_ctx, num_kv_heads, head_dim]
    keys = keys_from_cache(k_cache.index_select(0, flat_tables), head_dim, torch.float32)
    values = from_cache(v_cache.index_select(0, flat_tables), head_dim, torch.float32)
    keys = keys.view(num_seqs, max_ctx, num_kv_heads, -1)
    values = values.view(num_seqs, max_ctx, num_kv_heads, -1)
    q = query.view(num_seqs, num_kv_heads, group, head_dim).float()
    scores = torch.matmul(q, keys.permute(0, 2, 3, 1).float()) * scale  # [s, kvh, g, ctx]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    key_pos = torch.arange(max_ctx, device=query.device)
    lens = context_lens.long()[:, None]
    visible = key_pos[None, :] < lens
    if sliding_window is not None:
        visible &= key_pos[None, :] >= lens - sliding_window
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    out = torch.matmul(scores.softmax(-1), values.transpose(1, 2).float())  # [s, kvh, g, dim]
    return out.reshape(query.shape).to(query.dtype)


def torch_attention() -> AttentionBackend[TorchAttentionMetadata]:
    """The torch reference as a backend: runs on any device, e.g. a GPU without Triton."""
    return AttentionBackend("torch", prepare_torch_attention, store_kv_ref, paged_attention_ref)
