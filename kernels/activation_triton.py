"""Triton SiLU-and-mul: the GPU side of activation.py."""

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
def _silu_and_mul_kernel(
    out_ptr,
    x_ptr,
    stride_out,
    stride_x,
    num_rows,
    d,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """out[:, j] = silu(x[:, j]) * x[:, d + j],  silu(g) = g / (1 + exp(-g)).

    In fp32; silu(g) is rounded to x's dtype before the multiply, as in the reference.
    """
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # [BLOCK_ROWS]
    col = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
    mask = (row < num_rows)[:, None] & (col < d)[None, :]  # [BLOCK_ROWS, BLOCK_D]
    src = x_ptr + row.to(tl.int64)[:, None] * stride_x + col[None, :]
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + d, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    dst = out_ptr + row.to(tl.int64)[:, None] * stride_out + col[None, :]
    tl.store(dst, (silu * up).to(dtype), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, 2 * d] -> [num_tokens, d]."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0, x.shape
    check_last_dim_contiguous("x", x)
    num_rows, d = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_rows, d), dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out
    info = device_info(x)
    block_d = min(next_pow2(d), info.max_tile)
    block_rows = rows_per_program(num_rows, block_d, info)
    grid = (triton.cdiv(num_rows, block_rows), triton.cdiv(d, block_d))
    _silu_and_mul_kernel[grid](
        out,
        x,
        out.stride(0),
        x.stride(0),
        num_rows,
        d,
        BLOCK_ROWS=block_rows,
        BLOCK_D=block_d,
        num_warps=4,
    )
    return out
