"""Triton RMSNorm, optionally fused with the residual add: the GPU side of rms_norm.py.

Rounds where the torch reference rounds (the residual sum and the normalized value
are cast to x's dtype before the weight multiply), so the two paths agree to the last
bit wherever the reduction order allows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from hetero_infer.kernels.triton_utils import (
    check_last_dim_contiguous,
    device_info,
    next_pow2,
    row_warps,
    rows_per_program,
)


@triton.jit
def _rms_norm_kernel(
    out_ptr,
    residual_out_ptr,
    x_ptr,
    residual_ptr,
    weight_ptr,
    stride_out,
    stride_residual_out,
    stride_x,
    stride_residual,
    num_rows,
    hidden,
    eps,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    """Per row, in fp32:

    h = x + residual (rounded to x's dtype, and stored as the new residual) or x
    out = weight * (h / sqrt(mean(h^2) + eps))   (normalized value rounded to x's dtype)
    """
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # [BLOCK_ROWS]
    col = tl.arange(0, BLOCK_H)  # [BLOCK_H]
    mask = (row < num_rows)[:, None] & (col < hidden)[None, :]
    row = row.to(tl.int64)[:, None]
    col = col[None, :]
    # [BLOCK_ROWS, BLOCK_H]
    x = tl.load(x_ptr + row * stride_x + col, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + col, mask=mask, other=0.0)
        h = (x + residual.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_residual_out + col, h, mask=mask)
        x = h.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, 1) / hidden + eps)  # [BLOCK_ROWS]
    normed = (x * inv_rms[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + col, mask=col < hidden, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + row * stride_out + col, (weight * normed).to(out_ptr.dtype.element_ty), mask=mask
    )


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    assert x.dim() == 2, x.shape
    num_rows, hidden = x.shape
    assert weight.shape == (hidden,) and weight.is_contiguous(), (weight.shape, x.shape)
    check_last_dim_contiguous("x", x)
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype, (residual.shape, x.shape)
        check_last_dim_contiguous("residual", residual)
    # weight * x.to(dtype) promotes like the reference does
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    residual_out = torch.empty_like(x) if residual is not None else None
    if num_rows == 0:
        return out, residual_out
    info = device_info(x)
    block_h = next_pow2(hidden)
    block_rows = rows_per_program(num_rows, block_h, info)
    _rms_norm_kernel[(triton.cdiv(num_rows, block_rows),)](
        out,
        residual_out if residual is not None else out,
        x,
        residual if residual is not None else x,
        weight,
        out.stride(0),
        residual_out.stride(0) if residual is not None else 0,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        num_rows,
        hidden,
        eps,
        BLOCK_ROWS=block_rows,
        BLOCK_H=block_h,
        HAS_RESIDUAL=residual is not None,
        num_warps=row_warps(block_rows * block_h),
    )
    return out, residual_out


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [num_tokens, hidden] -> normalized, same shape."""
    out, _ = _launch(x, None, weight, eps)
    return out


def fused_add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual), both [num_tokens, hidden]."""
    out, residual_out = _launch(x, residual, weight, eps)
    return out, residual_out
