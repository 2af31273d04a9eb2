"""Triton RoPE for q and k in one launch: the GPU side of rotary.py.

Positions come from a tensor and the angles from the same cos/sin tables the torch
path uses, so any frequency scaling (linear, Llama-3) is already in the tables.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from hetero_infer.kernels.triton_utils import (
    check_last_dim_contiguous,
    device_info,
    next_pow2,
    rows_per_program,
)


@triton.jit
def _rotate_heads(
    out_ptr,
    x_ptr,
    tok,
    cos,
    sin,
    first,
    second,
    pair_valid,
    stride_x_tok,
    stride_x_head,
    stride_out_tok,
    stride_out_head,
    num_heads,
    HEADS_PAD: tl.constexpr,
):
    # tok [BLOCK_T]; cos, sin, first, second [BLOCK_T or 1, HALF_PAD] -> 3D via [:, None, :]
    head = tl.arange(0, HEADS_PAD)[None, :, None]
    tok3 = tok[:, None, None]
    mask = pair_valid[:, None, :] & (head < num_heads)  # [BLOCK_T, HEADS_PAD, HALF_PAD]
    src = x_ptr + tok3 * stride_x_tok + head * stride_x_head
    x1 = tl.load(src + first[:, None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + second[:, None, :], mask=mask, other=0.0).to(tl.float32)
    c, s = cos[:, None, :], sin[:, None, :]
    dst = out_ptr + tok3 * stride_out_tok + head * stride_out_head
    dtype = out_ptr.dtype.element_ty
    tl.store(dst + first[:, None, :], (x1 * c - x2 * s).to(dtype), mask=mask)
    tl.store(dst + second[:, None, :], (x2 * c + x1 * s).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_out_ptr,
    k_out_ptr,
    q_ptr,
    k_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_qo_tok,
    stride_qo_head,
    stride_ko_tok,
    stride_ko_head,
    stride_cos,
    stride_sin,
    num_tokens,
    num_heads,
    num_kv_heads,
    half,
    BLOCK_T: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
    IS_NEOX: tl.constexpr,
):
    """For token t at position p = positions[t], each head, and pair i < half:

        x1' = x1 cos(p f_i) - x2 sin(p f_i),   x2' = x2 cos(p f_i) + x1 sin(p f_i)

    with (x1, x2) = (x[i], x[i + half]) (neox) or (x[2i], x[2i + 1]) (GPT-J), and
    cos(p f_i) = cos_table[p, i]. The table entries are rounded to q's dtype first, as
    the reference (and Hugging Face) do; the rotation itself is in fp32.
    """
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    tok_valid = tok < num_tokens
    tok = tok.to(tl.int64)
    pair = tl.arange(0, HALF_PAD)[None, :]  # [1, HALF_PAD]
    pair_valid = tok_valid[:, None] & (pair < half)  # [BLOCK_T, HALF_PAD]
    pos = tl.load(positions_ptr + tok, mask=tok_valid, other=0).to(tl.int64)[:, None]
    dtype = q_ptr.dtype.element_ty
    cos = tl.load(cos_ptr + pos * stride_cos + pair, mask=pair_valid, other=0.0)
    sin = tl.load(sin_ptr + pos * stride_sin + pair, mask=pair_valid, other=0.0)
    cos = cos.to(dtype).to(tl.float32)  # [BLOCK_T, HALF_PAD]
    sin = sin.to(dtype).to(tl.float32)
    if IS_NEOX:
        first, second = pair, pair + half
    else:
        first, second = 2 * pair, 2 * pair + 1
    _rotate_heads(
        q_out_ptr,
        q_ptr,
        tok,
        cos,
        sin,
        first,
        second,
        pair_valid,
        stride_q_tok,
        stride_q_head,
        stride_qo_tok,
        stride_qo_head,
        num_heads,
        HEADS_PAD,
    )
    _rotate_heads(
        k_out_ptr,
        k_ptr,
        tok,
        cos,
        sin,
        first,
        second,
        pair_valid,
        stride_k_tok,
        stride_k_head,
        stride_ko_tok,
        stride_ko_head,
        num_kv_heads,
        HEADS_PAD,
    )


def rotary_triton(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim]
    by cos/sin tables [max_positions, head_dim] (each half repeated, neox layout)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert k.shape == (num_tokens, num_kv_heads, head_dim), (q.shape, k.shape)
    assert q.dtype == k.dtype, (q.dtype, k.dtype)
    assert head_dim % 2 == 0 and cos.shape == sin.shape and cos.shape[1] == head_dim
    assert positions.shape == (num_tokens,) and positions.is_contiguous()
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_last_dim_contiguous(name, t)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    info = device_info(q)
    half = head_dim // 2
    heads_pad, half_pad = next_pow2(max(num_heads, num_kv_heads)), next_pow2(half)
    block_t = rows_per_program(num_tokens, heads_pad * half_pad, info)
    _rotary_kernel[(triton.cdiv(num_tokens, block_t),)](
        q_out,
        k_out,
        q,
        k,
        positions,
        cos,
        sin,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        q_out.stride(0),
        q_out.stride(1),
        k_out.stride(0),
        k_out.stride(1),
        cos.stride(0),
        sin.stride(0),
        num_tokens,
        num_heads,
        num_kv_heads,
        half,
        BLOCK_T=block_t,
        HEADS_PAD=heads_pad,
        HALF_PAD=half_pad,
        IS_NEOX=is_neox,
        num_warps=4,
    )
    return q_out, k_out
