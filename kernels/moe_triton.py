"""Triton mixture-of-experts block: a grouped GEMM over the step's active experts.

The step's (token, slot) pairs are sorted by expert and each expert's run padded to a
whole number of BLOCK_M rows (``align_by_expert``, torch ops on the device); every
program then multiplies one BLOCK_M x BLOCK_N tile of one expert: its rows gathered
from the activations, the expert's weight tile read once for them. Only the active
experts' tiles are launched, so a decode step reads each active expert's weights once
and no other's. The gate_up product (rows gathered by token) goes through SiLU-and-mul,
the down product (rows in sorted order) is scaled by each pair's routing weight, and
each token's top-k rows are summed in fp32. Routing and the shared expert are torch
ops around it, as engine/models/moe.py computes them.

Float experts only ([num_experts, out, in] stacks in the model's dtype); experts kept
quantized run on the CPU's kernel (kernels/moe_cpu.py) or are dequantized at load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from hetero_infer.kernels.moe import MoeLayerSpec
from hetero_infer.kernels.triton_utils import device_info, dot_in_fp32


@triton.jit
def _grouped_gemm_kernel(
    out_ptr,
    x_ptr,
    w_ptr,
    rows_ptr,
    block_experts_ptr,
    weights_ptr,
    stride_out,
    stride_x,
    stride_we,
    stride_wn,
    num_pairs,
    N,
    K,
    TOP_K: tl.constexpr,
    GATHER_TOKENS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[pair, n] = sum_k x[src(pair), k] * w[e, n, k] (* weights[pair]) for the pairs
    of row block pid_m, all of one expert e = block_experts[pid_m].

    rows[pid_m * BLOCK_M + i] is a (token, slot) pair's index token * TOP_K + slot, or
    num_pairs for padding (neither loaded nor stored). src(pair) = pair // TOP_K where
    GATHER_TOKENS (x holds the tokens), else pair (x holds the pairs' rows). fp32 sums.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    pairs = tl.load(rows_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BLOCK_M]
    valid = pairs < num_pairs
    src = pairs // TOP_K if GATHER_TOKENS else pairs
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    x_rows = x_ptr + src.to(tl.int64)[:, None] * stride_x  # [BLOCK_M, 1]
    w_cols = w_ptr + expert * stride_we + cols.to(tl.int64)[None, :] * stride_wn  # [1, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        x = tl.load(x_rows + ks[None, :], mask=valid[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_cols + ks[:, None], mask=k_mask[:, None] & (cols < N)[None, :], other=0.0)
        if DOT_FP32:
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, w)
    if MUL_WEIGHT:
        acc *= tl.load(weights_ptr + pairs, mask=valid, other=0.0)[:, None]
    dst = out_ptr + pairs.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (cols < N)[None, :])


def align_by_expert(
    expert_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """expert_ids [tokens, top_k] -> (rows int32 [blocks * block_m]: the pairs' indices
    sorted by expert, each expert's run padded with tokens * top_k to whole blocks;
    block_experts int32 [blocks]: each block's expert). Inactive experts get no block."""
    flat = expert_ids.flatten()
    num_pairs = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    blocks = (counts + block_m - 1) // block_m  # [num_experts]
    block_experts = torch.repeat_interleave(
        torch.arange(num_experts, device=flat.device), blocks
    ).to(torch.int32)
    # Each pair's place: its expert's first padded row + its rank among the expert's pairs
    padded_start = torch.cumsum(blocks * block_m, 0) - blocks * block_m
    start = torch.cumsum(counts, 0) - counts
    sorted_experts = flat[order]
    rank = torch.arange(num_pairs, device=flat.device) - start[sorted_experts]
    rows = torch.full(
        (int(blocks.sum()) * block_m,), num_pairs, dtype=torch.int32, device=flat.device
    )
    rows[padded_start[sorted_experts] + rank] = order.to(torch.int32)
    return rows, block_experts


def grouped_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    rows: torch.Tensor,
    block_experts: torch.Tensor,
    num_pairs: int,
    top_k: int,
    gather_tokens: bool,
    weights: torch.Tensor | None = None,
    block_m: int = 16,
) -> torch.Tensor:
    """x [tokens or pairs, K] times each pair's expert's w [num_experts, N, K] ->
    [pairs, N] in x's dtype (scaled by ``weights`` [pairs] fp32 where given)."""
    assert w.dim() == 3 and w.shape[2] == x.shape[1] and x.stride(1) == 1 and w.stride(2) == 1
    n, k = w.shape[1], w.shape[2]
    out = torch.empty((num_pairs, n), dtype=x.dtype, device=x.device)
    if num_pairs == 0:
        return out
    info = device_info(x)
    block_n = 128 if info.interpreter else 64
    block_k = 128 if info.interpreter else 64
    grid = (block_experts.numel(), triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        out,
        x,
        w,
        rows,
        block_experts,
        weights if weights is not None else out,  # unread without MUL_WEIGHT
        out.stride(0),
        x.stride(0),
        w.stride(0),
        w.stride(1),
        num_pairs,
        n,
        k,
        TOP_K=top_k,
        GATHER_TOKENS=gather_tokens,
        MUL_WEIGHT=weights is not None,
        DOT_FP32=dot_in_fp32(x.dtype, info),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=4,
        num_stages=2,
    )
    return out


class TritonMoe:
    """x [tokens, hidden] -> the block's output, its experts by the grouped GEMM."""

    def __init__(self, spec: MoeLayerSpec) -> None:
        assert isinstance(spec.gate_up, torch.Tensor) and isinstance(spec.down, torch.Tensor)
        self.spec = spec
        self.num_experts = spec.gate_up.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        probs = torch.softmax(F.linear(x, spec.router).float(), dim=-1)
        weights, expert_ids = torch.topk(probs, spec.top_k, dim=-1)
        if spec.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype).float()
        out = self.experts(x, expert_ids, weights)
        if spec.shared is not None:
            gate_up, down, gate = spec.shared
            out = out + torch.sigmoid(F.linear(x, gate)) * down(gate_up(x))
        return out

    def experts(
        self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        spec = self.spec
        tokens, top_k = expert_ids.shape
        pairs = tokens * top_k
        x = x.contiguous()
        rows, block_experts = align_by_expert(expert_ids, self.num_experts, 16)
        gate_up = grouped_gemm(x, spec.gate_up, rows, block_experts, pairs, top_k, True)
        width = gate_up.shape[1] // 2
        gate, up = gate_up[:, :width], gate_up[:, width:]
        act = F.silu(gate) if spec.activation == "silu" else F.gelu(gate, approximate="tanh")
        hidden = (act * up).contiguous()
        y = grouped_gemm(
            hidden,
            spec.down,
            rows,
            block_experts,
            pairs,
            top_k,
            False,
            weights.flatten().contiguous(),
        )
        return y.view(tokens, top_k, -1).float().sum(dim=1).to(x.dtype)


def pack_moe_triton(spec: MoeLayerSpec) -> TritonMoe | None:
    """The Triton block for float experts; None for quantized ones."""
    if not isinstance(spec.gate_up, torch.Tensor) or spec.activation not in (
        "silu",
        "gelu_pytorch_tanh",
    ):
        return None
    return TritonMoe(spec)
