"""Triton LoRA: each adapter's low-rank update added to its rows of a projection's
output, the GPU side of kernels/lora.py (same math, fp32 sums, rounded once into out).

An adapter's weights on a projection are packed once (``pack_lora_triton``): A of its
parts stacked and zero-padded to a power-of-two rank [RANK, in], and B as one dense
[columns, RANK] matrix whose zeros keep each part to its own ranks (q's columns read
only q's ranks). Per group of rows (an adapter's rows in the step) two launches: the
shrink, one program per row, t[row] = A @ x[row]; the expand, one program per row and
block of columns, out[row, cols] += B[cols] @ t[row]. The rows are gathered by index,
so a group's rows need not be contiguous.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from hetero_infer.kernels.lora import LoRAGroup, LoRAPart
from hetero_infer.kernels.triton_utils import next_pow2

BLOCK_K = 64  # input features per step of the shrink
BLOCK_N = 64  # output columns per program of the expand


class LoRAWeightsTriton(NamedTuple):
    a: torch.Tensor  # [RANK, in], zero rows past the adapter's ranks
    b: torch.Tensor  # [columns, RANK]: each part's B in its own columns and ranks


@triton.jit
def _lora_shrink_kernel(
    t_ptr,
    x_ptr,
    a_ptr,
    rows_ptr,
    stride_t,
    stride_x,
    stride_a,
    num_in,
    RANK: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """t[i, :] = A @ x[rows[i], :] in fp32, for the group's i-th row."""
    i = tl.program_id(0)
    row = tl.load(rows_ptr + i).to(tl.int64)
    rank = tl.arange(0, RANK)
    acc = tl.zeros([RANK], dtype=tl.float32)
    for k0 in range(0, num_in, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * stride_x + k, mask=k < num_in, other=0.0).to(tl.float32)
        a = tl.load(
            a_ptr + rank[:, None] * stride_a + k[None, :], mask=k[None, :] < num_in, other=0.0
        ).to(tl.float32)  # [RANK, BLOCK_K]
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(t_ptr + i * stride_t + rank, acc)


@triton.jit
def _lora_expand_kernel(
    out_ptr,
    t_ptr,
    b_ptr,
    rows_ptr,
    stride_out,
    stride_t,
    stride_b,
    num_cols,
    RANK: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """out[rows[i], cols] += B[cols, :] @ t[i, :], summed in fp32, rounded once."""
    i = tl.program_id(0)
    col = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row = tl.load(rows_ptr + i).to(tl.int64)
    rank = tl.arange(0, RANK)
    t = tl.load(t_ptr + i * stride_t + rank)  # [RANK] fp32
    mask = col < num_cols
    b = tl.load(b_ptr + col[:, None] * stride_b + rank[None, :], mask=mask[:, None], other=0.0).to(
        tl.float32
    )  # [BLOCK_N, RANK]
    delta = tl.sum(b * t[None, :], axis=1)
    target = out_ptr + row * stride_out + col
    out = tl.load(target, mask=mask, other=0.0).to(tl.float32)
    tl.store(target, (out + delta).to(out_ptr.dtype.element_ty), mask=mask)


def pack_lora_triton(a: torch.Tensor, parts: Sequence[LoRAPart]) -> LoRAWeightsTriton:
    """A [R, in] and the parts (kernels/lora.py) -> the padded A and dense B."""
    rank = max(16, next_pow2(a.shape[0]))
    padded = a.new_zeros(rank, a.shape[1])
    padded[: a.shape[0]] = a
    columns = max(out_start + b.shape[0] for out_start, _, b in parts)
    dense = a.new_zeros(columns, rank)
    for out_start, rank_start, b in parts:
        dense[out_start : out_start + b.shape[0], rank_start : rank_start + b.shape[1]] = b
    return LoRAWeightsTriton(padded.contiguous(), dense.contiguous())


def add_lora_triton(
    out: torch.Tensor, x: torch.Tensor, groups: Sequence[LoRAGroup], assign: bool = False
) -> torch.Tensor:
    """out [tokens, n] += each group's update of its rows of x [tokens, in] (groups as
    kernels/lora.py's, their weights packed by pack_lora_triton); returns out. assign:
    out is set to the updates (zero on rows of no adapter)."""
    if assign:
        out.zero_()
    assert out.dim() == 2 and x.dim() == 2 and out.shape[0] == x.shape[0]
    assert out.stride(1) == 1 and x.stride(1) == 1, "rows must be contiguous"
    for rows, weights in groups:
        a, b = weights
        assert a.shape[1] == x.shape[1] and b.shape[0] <= out.shape[1]
        if rows is None:
            rows = torch.arange(x.shape[0], device=x.device)
        rows = rows.to(torch.int32).contiguous()
        n, rank = rows.shape[0], a.shape[0]
        t = torch.empty(n, rank, device=x.device, dtype=torch.float32)
        _lora_shrink_kernel[(n,)](
            t, x, a, rows, t.stride(0), x.stride(0), a.stride(0), x.shape[1],
            RANK=rank, BLOCK_K=BLOCK_K,
        )  # fmt: skip
        grid = (n, triton.cdiv(b.shape[0], BLOCK_N))
        _lora_expand_kernel[grid](
            out, t, b, rows, out.stride(0), t.stride(0), b.stride(0), b.shape[0],
            RANK=rank, BLOCK_N=BLOCK_N,
        )  # fmt: skip
    return out
