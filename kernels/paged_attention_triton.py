"""Triton paged attention: the GPU side of kernels/paged_attention.py (the KV store that
fills the cache it reads is store_kv_triton.py).

Same contract as ``paged_attention_ref``: each sequence's chunk of new query tokens
(1 for a decode; many for a prefill chunk, with or without cached context before it)
attends causally to everything cached for that sequence, found through its block table.

One kernel serves every case. A program owns one KV head of one sequence and a tile of
BLOCK_M rows; a row is one (query token, query head) pair of that KV head's group, so
GQA reads each key once for all the heads that share it (vLLM's "unified" layout):

    row r -> token  q_tile * BLOCK_Q + r // GROUP,  head  kv_head * GROUP + r % GROUP

A decode is the tile with BLOCK_Q = 1. When a decode batch has too few
(sequence, KV head) pairs to fill the GPU, each pair's context is split across
NUM_SPLITS programs (flash-decoding) whose partial results a second kernel combines.

A quantized cache (kernels/kv_quant.py) is read as stored: int8 rows times their
groups' fp16 scales, in the query's dtype, for the dot products (QUANT=1); fp8 rows
convert to the query's dtype (QUANT=2), as store_kv_triton wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from hetero_infer.kernels.attention_backend import AttentionInputs
from hetero_infer.kernels.kv_quant import (
    rotate_groups,
    rotates_keys,
    scale_group,
    stored_head_size,
)
from hetero_infer.kernels.paged_attention import TorchAttentionMetadata, paged_attention_ref
from hetero_infer.kernels.store_kv_triton import cache_quant
from hetero_infer.kernels.triton_utils import (
    DeviceInfo,
    check_last_dim_contiguous,
    device_info,
    dot_in_fp32,
    next_pow2,
    rows_per_program,
)


@triton.jit
def _dot(a, b, FP32: tl.constexpr):
    # fp32 operands in full IEEE precision (no TF32); else b's 16-bit dtype, fp32 accumulate
    if FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a.to(b.dtype), b)


@triton.jit
def _load_cache(ptrs, mask, QUANT: tl.constexpr):
    # Cache elements, 0 where masked. fp8 has no cast from an integer 0 to fill the
    # masked lanes with, so those are zeroed after converting to fp32.
    if QUANT == 2:
        values = tl.where(mask, tl.load(ptrs, mask=mask).to(tl.float32), 0.0)
    else:
        values = tl.load(ptrs, mask=mask, other=0)
    return values


@triton.jit
def _value_scales(cache_ptr, row_off, dim, head_dim, scale_group, valid):
    # The fp16 scale of each value at dim of the int8 row starting at row_off (shapes
    # broadcast together), from its two bytes after the row's values (little-endian;
    # a scale need not be 2-byte aligned), in fp32.
    scale_off = row_off + head_dim + 2 * (dim // scale_group)
    bits = tl.zeros(scale_off.shape, tl.int32)
    for i in tl.static_range(2):
        byte = tl.load(cache_ptr + scale_off + i, mask=valid, other=0)
        bits |= (byte.to(tl.uint8, bitcast=True).to(tl.int32)) << (8 * i)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _softcap(s, cap):
    # cap * tanh(s / cap), tanh from exp2 (no tanh in tl.math); |s / cap| is clamped at
    # 15, where tanh is 1 in fp32, so that exp2 stays finite.
    t = tl.minimum(tl.maximum(s / cap, -15.0), 15.0)
    e = tl.exp2(t * 2.8853900817779268)  # e^(2t): 2 log2(e)
    return cap * (1.0 - 2.0 / (e + 1.0))


@triton.jit
def _paged_attention_kernel(
    out_ptr,
    query_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    query_start_loc_ptr,
    part_out_ptr,
    part_lse_ptr,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    stride_bt_seq,
    num_heads,
    head_dim,
    scale_group,
    scale,
    window,
    softcap,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    DOT_FP32: tl.constexpr,
    QUANT: tl.constexpr,
):
    """Causal attention of one query tile to its sequence's paged context.

    For a query token at absolute position p = context_len - query_len + i:

        out = sum_j softmax_j(scale * q . k_j) v_j   over keys j <= p (and j > p - window)

    computed online over key tiles of BLOCK_N positions, in base 2:
    s = q . k * scale * log2(e); m = running max; l = running sum of 2^(s - m);
    acc = running sum of 2^(s - m) v. A row that has seen no key yet keeps m = -inf and
    uses 0 as its offset, so no NaN appears; its l stays 0 and its output is 0. With
    USE_SOFTCAP the scaled score becomes softcap * tanh(score / softcap) first (Gemma 2).

    With NUM_SPLITS > 1 this program covers one of NUM_SPLITS equal slices of the key
    range and writes acc / l and lse = m + log2(l) (base 2) for _combine_splits_kernel.
    """
    seq = tl.program_id(0)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS

    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q >= query_len:
        return
    context_len = tl.load(context_lens_ptr + seq)
    num_cached = context_len - query_len  # tokens before this chunk

    rows = tl.arange(0, BLOCK_M)
    q_idx = q_tile * BLOCK_Q + rows // GROUP  # [BLOCK_M] index in the chunk
    head = kv_head * GROUP + rows % GROUP  # [BLOCK_M]
    row_valid = (rows < BLOCK_Q * GROUP) & (q_idx < query_len)
    q_pos = num_cached + q_idx  # [BLOCK_M] absolute position
    tok = (q_start + q_idx).to(tl.int64)
    dim = tl.arange(0, HEAD_PAD)
    dim_valid = dim < head_dim
    # [BLOCK_M, HEAD_PAD]
    q = tl.load(
        query_ptr + tok[:, None] * stride_q_tok + head[:, None] * stride_q_head + dim[None, :],
        mask=row_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )

    # Keys this tile needs: [lo, hi).
    first_pos = num_cached + q_tile * BLOCK_Q
    hi = tl.minimum(first_pos + BLOCK_Q, context_len)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(first_pos - window + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
    if NUM_SPLITS > 1:
        per_split = tl.cdiv(tl.cdiv(hi - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = lo + split * per_split
        hi = tl.minimum(hi, lo + per_split)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    qk_scale = scale * 1.4426950408889634  # log2(e): exp2 instead of exp
    cols = tl.arange(0, BLOCK_N)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for start in range(lo, hi, BLOCK_N):
        k_pos = start + cols  # [BLOCK_N]
        k_valid = k_pos < hi
        block = tl.load(table + k_pos // BLOCK_SIZE, mask=k_valid, other=0).to(tl.int64)
        slot = k_pos % BLOCK_SIZE
        k_off = block * stride_kc_block + slot * stride_kc_slot + kv_head * stride_kc_head
        # [HEAD_PAD, BLOCK_N]: loaded transposed for q @ k^T
        k_mask = dim_valid[:, None] & k_valid[None, :]
        k = _load_cache(k_cache_ptr + k_off[None, :] + dim[:, None], k_mask, QUANT)
        if QUANT == 1:  # dequantized into the query's dtype, as the torch reference
            scales = _value_scales(
                k_cache_ptr, k_off[None, :], dim[:, None], head_dim, scale_group, k_mask
            )
            k = (k.to(tl.float32) * scales).to(q.dtype)
        elif QUANT != 0:
            k = k.to(q.dtype)
        s = _dot(q, k, DOT_FP32)  # [BLOCK_M, BLOCK_N], then scaled into base 2
        s = _softcap(s * scale, softcap) * 1.4426950408889634 if USE_SOFTCAP else s * qk_scale
        mask = row_valid[:, None] & k_valid[None, :] & (k_pos[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            mask = mask & (k_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(mask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)  # [BLOCK_M]
        p = tl.exp2(s - m_safe[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = block * stride_vc_block + slot * stride_vc_slot + kv_head * stride_vc_head
        v_mask = k_valid[:, None] & dim_valid[None, :]
        # [BLOCK_N, HEAD_PAD]
        v = _load_cache(v_cache_ptr + v_off[:, None] + dim[None, :], v_mask, QUANT)
        if QUANT == 1:
            scales = _value_scales(
                v_cache_ptr, v_off[:, None], dim[None, :], head_dim, scale_group, v_mask
            )
            v = (v.to(tl.float32) * scales).to(q.dtype)
        elif QUANT != 0:
            v = v.to(q.dtype)
        acc = acc * alpha[:, None] + _dot(p, v, DOT_FP32)
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # [BLOCK_M, HEAD_PAD]
    if NUM_SPLITS == 1:
        o_ptr = out_ptr + tok[:, None] * stride_o_tok + head[:, None] * stride_o_head
        tl.store(
            o_ptr + dim[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & dim_valid[None, :],
        )
    else:
        part = (tok * num_heads + head) * NUM_SPLITS + split  # [BLOCK_M]
        has_keys = l_i > 0.0
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_valid)
        tl.store(
            part_out_ptr + part[:, None] * HEAD_PAD + dim[None, :], out, mask=row_valid[:, None]
        )


@triton.jit
def _combine_splits_kernel(
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    stride_o_tok,
    stride_o_head,
    num_rows,
    num_heads,
    head_dim,
    BLOCK_R: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    """Per (token, head) row: out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M),
    M = max_s lse_s.

    Every token sees its own position in some split, so M is finite; empty splits have
    lse = -inf and weigh 0.
    """
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]: tok * heads + head
    row_valid = row < num_rows
    row = tl.where(row_valid, row, 0).to(tl.int64)
    splits = tl.arange(0, NUM_SPLITS)
    dim = tl.arange(0, HEAD_PAD)
    part = row[:, None] * NUM_SPLITS + splits[None, :]  # [BLOCK_R, NUM_SPLITS]
    lse = tl.load(part_lse_ptr + part)
    weight = tl.exp2(lse - tl.max(lse, 1)[:, None])  # [BLOCK_R, NUM_SPLITS]
    # [BLOCK_R, NUM_SPLITS, HEAD_PAD]
    partial = tl.load(part_out_ptr + part[:, :, None] * HEAD_PAD + dim[None, None, :])
    out = tl.sum(partial * weight[:, :, None], 1) / tl.sum(weight, 1)[:, None]
    tok, head = row // num_heads, row % num_heads
    dst = out_ptr + tok[:, None] * stride_o_tok + head[:, None] * stride_o_head + dim[None, :]
    tl.store(
        dst, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & (dim < head_dim)[None, :]
    )


@dataclass(frozen=True)
class AttentionTiles:
    block_m: int  # rows (query token x head of a KV group) per program
    block_n: int  # key positions per loop step
    num_splits: int  # programs per (sequence, KV head) along the context (power of 2)
    num_warps: int
    num_stages: int


def choose_tiles(
    info: DeviceInfo,
    head_pad: int,
    group: int,
    num_seqs: int,
    num_kv_heads: int,
    max_query_len: int,
    max_context_len: int,
) -> AttentionTiles:
    """Tile sizes for this device and step; no autotuning (see kernels/triton_utils.py)."""
    min_m = max(16, next_pow2(group))  # tl.dot needs >= 16 rows
    decode = max_query_len == 1
    if info.interpreter:
        # Cost is per program and per loop step, so: few programs, long key tiles.
        block_m = min_m if decode else max(min_m, min(64, next_pow2(max_query_len * group)))
        block_n = max(16, min(128, next_pow2(max_context_len)))
        return AttentionTiles(block_m, block_n, 1, 4, 1)
    block_n = 64 if head_pad <= 128 else 32
    if decode:
        # Flash-decoding: split long contexts while (sequence, KV head) pairs leave SMs
        # idle, keeping at least 256 keys per split.
        work, splits = num_seqs * num_kv_heads, 1
        while splits < 16 and work * splits < 2 * info.num_sms and max_context_len >= 512 * splits:
            splits *= 2
        return AttentionTiles(min_m, block_n, splits, 4, 2)
    block_m = max(min_m, 128 if info.capability >= (8, 0) and head_pad <= 128 else 64)
    # sm80 and sm90 have the shared memory for a third stage; sm86/89 do not.
    num_stages = 3 if info.capability in ((8, 0), (9, 0)) else 2
    return AttentionTiles(block_m, block_n, 1, 8 if block_m >= 128 else 4, num_stages)


def paged_attention_triton(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionInputs,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    *,
    tiles: AttentionTiles | None = None,
) -> torch.Tensor:
    """query [num_tokens, num_heads, head_dim] -> output of the same shape. ``tiles``
    overrides the per-device choice (tests use it to cover many loop steps and the split
    path)."""
    if isinstance(meta, TorchAttentionMetadata):  # AttentionInputs.bidirectional_ends
        return paged_attention_ref(query, k_cache, v_cache, meta, scale, sliding_window, softcap)
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    num_seqs = meta.num_seqs
    quant = cache_quant(k_cache)
    assert k_cache.shape == v_cache.shape, (k_cache.shape, v_cache.shape)
    assert cache_dim == stored_head_size(head_dim, k_cache.dtype), (query.shape, k_cache.shape)
    assert num_heads % num_kv_heads == 0, (query.shape, k_cache.shape)
    assert k_cache.dtype == v_cache.dtype and (quant or query.dtype == k_cache.dtype)
    for name, t in (("query", query), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_last_dim_contiguous(name, t)
    assert meta.block_tables.dtype == torch.int32 and meta.block_tables.stride(1) == 1
    assert meta.block_tables.shape[0] == num_seqs, (meta.block_tables.shape, num_seqs)
    assert meta.context_lens.dtype == torch.int32 and meta.context_lens.is_contiguous()
    assert meta.query_start_loc.dtype == torch.int32 and meta.query_start_loc.is_contiguous()
    assert meta.query_start_loc.shape == (num_seqs + 1,), meta.query_start_loc.shape
    assert sliding_window is None or sliding_window >= 1, sliding_window
    assert softcap is None or softcap > 0, softcap

    info = device_info(query)
    if rotates_keys(k_cache.dtype, head_dim):  # the same scores against rotated keys
        query = rotate_groups(query).to(query.dtype)
    group = num_heads // num_kv_heads
    head_pad = max(16, next_pow2(head_dim))
    if tiles is None:
        tiles = choose_tiles(
            info,
            head_pad,
            group,
            num_seqs,
            num_kv_heads,
            meta.max_query_len,
            meta.max_context_len,
        )
    assert tiles.block_m >= max(16, group) and tiles.block_m == next_pow2(tiles.block_m), tiles
    assert tiles.block_n >= 16 and tiles.num_splits == next_pow2(tiles.num_splits), tiles
    block_q = tiles.block_m // group  # query tokens per tile

    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    splits = tiles.num_splits
    if splits > 1:
        part_out = torch.empty(
            (num_tokens, num_heads, splits, head_pad), dtype=torch.float32, device=query.device
        )
        part_lse = torch.empty(
            (num_tokens, num_heads, splits), dtype=torch.float32, device=query.device
        )
    else:
        part_out = part_lse = out  # unused
    grid = (num_seqs, triton.cdiv(meta.max_query_len, block_q), num_kv_heads * splits)
    _paged_attention_kernel[grid](
        out,
        query,
        k_cache,
        v_cache,
        meta.block_tables,
        meta.context_lens,
        meta.query_start_loc,
        part_out,
        part_lse,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        meta.block_tables.stride(0),
        num_heads,
        head_dim,
        scale_group(head_dim),  # unread unless the cache is int8
        scale,
        sliding_window or 0,
        softcap or 1.0,  # unread without USE_SOFTCAP
        BLOCK_SIZE=block_size,
        GROUP=group,
        BLOCK_M=tiles.block_m,
        BLOCK_Q=block_q,
        BLOCK_N=tiles.block_n,
        HEAD_PAD=head_pad,
        NUM_SPLITS=splits,
        USE_WINDOW=sliding_window is not None,
        USE_SOFTCAP=softcap is not None,
        DOT_FP32=dot_in_fp32(query.dtype, info),
        QUANT=quant,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    if splits > 1:
        num_rows = num_tokens * num_heads
        block_r = rows_per_program(num_rows, splits * head_pad, info)
        _combine_splits_kernel[(triton.cdiv(num_rows, block_r),)](
            out,
            part_out,
            part_lse,
            out.stride(0),
            out.stride(1),
            num_rows,
            num_heads,
            head_dim,
            BLOCK_R=block_r,
            NUM_SPLITS=splits,
            HEAD_PAD=head_pad,
            num_warps=4,
        )
    return out
