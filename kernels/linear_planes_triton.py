"""Triton linear layers on GGUF weights in planes (kernels/quantized_planes.py): the GPU
path for the types the planes hold; kernels/linear_quantized_triton.py keeps the rest.

y [M, N] = x [M, K] @ dequant(W) [N, K]^T (+ bias). K is walked in steps of 256 values
(a K-quant's super-block; 8 blocks of 32 otherwise), each step as 8 chunks of 32 values,
and each chunk as two halves of 16 whose bytes are one 16-byte run of the values plane
(Q8_0: two runs): a half's 16 values share one scale s and offset o (Q4_1, Q5_1 and the
K-quants' -dmin * min), so

    y[m, n] = sum over halves h of  s[n, h] * sum_i x[m, i] q[n, i]  +  o[n, h] * sum_i x[m, i]

with q the half's integers (exact in fp32 and in x's 16-bit dtype, |q| <= 128) and the
sums in fp32: the result differs from the fp64 product with the dequantized weight by
fp32 rounding only (and the rounding of y to x's dtype).

Four shapes of program, chosen by the activation rows M and the type
(``choose_planes_tiles``):

- ``words`` (M <= 4, decode, the types of kernels/planes_gemv_triton.py: all of the
  planes' today): the GEMV that reads values as 32-bit words, about half the
  instructions a value of ``gemv``;
- ``gemv`` (M <= 4, a type the words would not take; the sweep times it beside them):
  no tl.dot; a program takes BLOCK_N weight rows and all M rows of x, loads UNROLL
  steps' [BLOCK_N, 8 UNROLL, 16] bytes at once (16 contiguous bytes a lane), and keeps
  [M, BLOCK_N, 8 UNROLL] partial sums in registers, reduced once at the end; K split
  only where the programs would leave SMs idle;
- ``split-K`` (M <= 32): tl.dot per half ([BLOCK_M, 16] @ [16, BLOCK_N]), K split across
  programs whose fp32 partial sums are added afterwards;
- ``tiles`` (M > 32): the same kernel, 64 x 64 tiles, no split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from hetero_infer.kernels.planes_decode_triton import (
    decode_chunk,
    dot_integers,
    integers_to_f32,
    load_x_chunk,
)
from hetero_infer.kernels.planes_gemv_triton import (
    GEMV_WORD_TYPES,
    launch_planes_gemv_words,
)
from hetero_infer.kernels.quantized import QuantizedWeight
from hetero_infer.kernels.quantized_planes import PlanarWeight, pack_planes, planes_take
from hetero_infer.kernels.triton_utils import (
    DeviceInfo,
    device_info,
    dot_in_fp32,
    finish_split_k,
    interpreting,
    next_pow2,
    split_k_target,
)

STEP_VALUES = 256  # values of K per loop step, every type
GEMV_MAX_ROWS = 4
SPLIT_K_MAX_ROWS = 32
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The planes each type has, in the kernels' argument order (absent ones: a placeholder).
PLANE_ARGS = ("values", "highs", "scales", "mins", "d", "dmin")
HAS_OFFSET = ("Q4_1", "Q5_1", "Q4_K", "Q5_K")


# ---- the kernels ----


@triton.jit
def _planes_gemv_kernel(
    out_ptr,
    x_ptr,
    v_ptr,
    h_ptr,
    s_ptr,
    m_ptr,
    d_ptr,
    dm_ptr,
    bias_ptr,
    stride_out_split,
    stride_out,
    stride_x,
    stride_v,
    stride_h,
    stride_s,
    stride_m,
    stride_d,
    stride_dm,
    M,
    N,
    num_blocks,
    num_steps,
    steps_per_split,
    QTYPE: tl.constexpr,
    HAS_OFFSET: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UNROLL: tl.constexpr,
):
    """out[m, n] = sum_k x[m, k] dequant(w)[n, k] (+ bias[n]) over this program's steps
    (a split's share: ``out`` its fp32 partial sums, ``stride_out_split`` apart, no
    bias). Program (n tile, m tile, split); 4-D tiles [BLOCK_M, BLOCK_N, 8 UNROLL
    chunks, 16]: UNROLL steps a loop turn, their loads all issued before their sums."""
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    chunks = tl.arange(0, 8 * UNROLL)[None, :, None]  # [1, 8 UNROLL, 1]: a turn's chunks
    c = chunks % 8  # the chunk within its step
    j = tl.arange(0, 16)[None, None, :]  # [1, 1, 16]: a half's values
    x_rows = x_ptr + rows.to(tl.int64)[:, None, None] * stride_x  # [BLOCK_M, 1, 1]
    x_mask = (rows < M)[:, None, None]
    w_cols = cols.to(tl.int64)[:, None, None]  # [BLOCK_N, 1, 1]
    w_mask = (cols < N)[:, None, None]
    v_rows = v_ptr + w_cols * stride_v
    h_rows = h_ptr + w_cols * stride_h
    s_rows = s_ptr + w_cols * stride_s
    m_rows = m_ptr + w_cols * stride_m
    d_rows = d_ptr + w_cols * stride_d
    dm_rows = dm_ptr + w_cols * stride_dm

    acc = tl.zeros((BLOCK_M, BLOCK_N, 8 * UNROLL, 1), dtype=tl.float32)
    first = tl.program_id(2) * steps_per_split
    end = tl.minimum(first + steps_per_split, num_steps)
    for turn in range(first, end, UNROLL):
        step = turn + chunks // 8  # [1, 8 UNROLL, 1]
        # A split's last turn may pass its end, a row's last step its last block.
        live = (step < end) & ((step * 8 + c) < num_blocks)
        q_lo, q_hi, s_lo, s_hi, o_lo, o_hi = decode_chunk(
            v_rows, h_rows, s_rows, m_rows, d_rows, dm_rows, step, c, j, w_mask & live, QTYPE
        )  # q_*: [BLOCK_N, 8 UNROLL, 16]; s_*, o_*: [BLOCK_N, 8 UNROLL, 1]
        x_lo, x_hi = load_x_chunk(x_rows, step, c, j, x_mask & live, QTYPE)
        x_lo = x_lo.to(tl.float32)[:, None, :, :]
        x_hi = x_hi.to(tl.float32)[:, None, :, :]
        dot_lo = tl.sum(x_lo * integers_to_f32(q_lo)[None, :, :, :], axis=3, keep_dims=True)
        dot_hi = tl.sum(x_hi * integers_to_f32(q_hi)[None, :, :, :], axis=3, keep_dims=True)
        acc += dot_lo * s_lo[None, :, :, :] + dot_hi * s_hi[None, :, :, :]
        if HAS_OFFSET:
            acc += tl.sum(x_lo, axis=3, keep_dims=True) * o_lo[None, :, :, :]
            acc += tl.sum(x_hi, axis=3, keep_dims=True) * o_hi[None, :, :, :]
    y = tl.sum(tl.sum(acc, axis=3), axis=2)  # [BLOCK_M, BLOCK_N]
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=cols < N, other=0.0)[None, :]
    dst = out_ptr + tl.program_id(2) * stride_out_split
    dst += rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(dst, y.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & (cols < N)[None, :])


@triton.jit
def _planes_dot_kernel(
    out_ptr,
    x_ptr,
    v_ptr,
    h_ptr,
    s_ptr,
    m_ptr,
    d_ptr,
    dm_ptr,
    bias_ptr,
    stride_out_split,
    stride_out,
    stride_x,
    stride_v,
    stride_h,
    stride_s,
    stride_m,
    stride_d,
    stride_dm,
    M,
    N,
    num_blocks,
    num_steps,
    steps_per_split,
    QTYPE: tl.constexpr,
    HAS_OFFSET: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """As _planes_gemv_kernel, by tl.dot on [BLOCK_M, BLOCK_N] tiles, a half at a time:
    its 16 bytes per weight row are read as [16, BLOCK_N] (contiguous along the 16)."""
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = (rows < M)[:, None]  # [BLOCK_M, 1]
    col_mask = (cols < N)[None, :]  # [1, BLOCK_N]
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x  # [BLOCK_M, 1]
    w_cols = cols.to(tl.int64)[None, :]  # [1, BLOCK_N]
    v_rows = v_ptr + w_cols * stride_v
    h_rows = h_ptr + w_cols * stride_h
    s_rows = s_ptr + w_cols * stride_s
    m_rows = m_ptr + w_cols * stride_m
    d_rows = d_ptr + w_cols * stride_d
    dm_rows = dm_ptr + w_cols * stride_dm
    j_w = tl.arange(0, 16)[:, None]  # [16, 1]: a half's values, down the weight tile
    j_x = tl.arange(0, 16)[None, :]  # [1, 16]: along the activations

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = tl.program_id(2) * steps_per_split
    for step in range(first, tl.minimum(first + steps_per_split, num_steps)):
        for c in tl.static_range(8):
            # A tensor, not a scalar: the interpreter's loop index is a Python int.
            live = tl.full((1, 1), step * 8 + c, tl.int32) < num_blocks
            q_lo, q_hi, s_lo, s_hi, o_lo, o_hi = decode_chunk(
                v_rows,
                h_rows,
                s_rows,
                m_rows,
                d_rows,
                dm_rows,
                step,
                c,
                j_w,
                col_mask & live,
                QTYPE,
            )  # q_*: [16, BLOCK_N]; s_*, o_*: [1, BLOCK_N]
            x_lo, x_hi = load_x_chunk(x_rows, step, c, j_x, row_mask & live, QTYPE)  # [BLOCK_M, 16]
            acc += (
                dot_integers(x_lo, q_lo, DOT_FP32) * s_lo
                + dot_integers(x_hi, q_hi, DOT_FP32) * s_hi
            )
            if HAS_OFFSET:
                acc += tl.sum(x_lo.to(tl.float32), axis=1)[:, None] * o_lo
                acc += tl.sum(x_hi.to(tl.float32), axis=1)[:, None] * o_hi
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0)[None, :]
    dst = out_ptr + tl.program_id(2) * stride_out_split
    dst += rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=row_mask & col_mask)


# ---- launching ----


@dataclass(frozen=True)
class PlanesTiles:
    # "words" (kernels/planes_gemv_triton.py: every type of the planes today), "gemv"
    # (byte-wise, no tl.dot either: a type the words do not take, and the sweep's
    # comparison) or "dot" (split-K where num_splits > 1, tiles)
    kernel: str
    block_m: int  # activation rows per program (tl.dot needs >= 16)
    block_n: int  # weight rows (outputs) per program
    num_splits: int  # programs along K per output tile, 1: none
    num_warps: int
    num_stages: int
    # gemv: steps a loop turn (more bytes in flight); words: 16-byte chunks a lane a
    # turn. A power of two.
    unroll: int = 1


def choose_planes_tiles(
    info: DeviceInfo, num_rows: int, out_features: int, num_steps: int, qtype: str
) -> PlanesTiles:
    """The kernel and its tiles by the activation rows and the type; no autotuning (see
    kernels/triton_utils.py)."""
    if num_rows <= GEMV_MAX_ROWS and qtype in GEMV_WORD_TYPES:
        return _words_tiles(info, num_rows, out_features, num_steps)
    if info.interpreter:
        # Cost is per program and per loop step: few programs, wide tiles.
        if num_rows <= GEMV_MAX_ROWS:
            return PlanesTiles(
                "gemv", next_pow2(num_rows), min(64, next_pow2(out_features)), 1, 4, 1
            )
        block_m = max(16, min(64, next_pow2(num_rows)))
        return PlanesTiles("dot", block_m, max(16, min(128, next_pow2(out_features))), 1, 4, 1)
    if num_rows <= GEMV_MAX_ROWS:
        # 2 weight rows a program of one warp, 8 steps a loop turn: four 16-byte loads
        # in flight a lane. On an H200 (bench.planes_linear --sweep) it was within 14%
        # of the fastest tiles on each of Llama-8B's projections in Q4_0, Q4_K and Q8_0,
        # and splitting K never gained there; it is split only where the tiles leave
        # SMs short of ~2 programs.
        tiles = triton.cdiv(out_features, 2)
        splits = _splits(tiles, num_steps, 2 * info.num_sms, min_steps=8)
        return PlanesTiles("gemv", next_pow2(num_rows), 2, splits, 1, 3, 8)
    if num_rows <= SPLIT_K_MAX_ROWS:
        tiles = triton.cdiv(out_features, 64)
        splits = _splits(tiles, num_steps, 2 * info.num_sms, min_steps=2)
        return PlanesTiles("dot", 16 if num_rows <= 16 else 32, 64, splits, 4, 2)
    return PlanesTiles("dot", 64, 64, 1, 4, 2)


def _words_tiles(info: DeviceInfo, num_rows: int, out_features: int, num_steps: int) -> PlanesTiles:
    block_m = next_pow2(num_rows)
    if info.interpreter:  # few programs, long turns
        return PlanesTiles("words", block_m, min(64, next_pow2(out_features)), 1, 1, 1, 4)
    # 8 weight rows a program against the same activations, 4 warps along K, a chunk a
    # lane a turn: by the compiled code's count (sm90), ~4 instructions a value, where
    # the byte-wise GEMV's tiles took 8. Not yet timed on a GPU (bench.planes_linear's
    # sweep times these beside the byte-wise GEMV's).
    tiles = triton.cdiv(out_features, 8)
    splits = _splits(tiles, num_steps, 2 * info.num_sms, min_steps=4)
    return PlanesTiles("words", block_m, 8, splits, 4, 1, 1)


def _splits(tiles: int, num_steps: int, programs: int, min_steps: int) -> int:
    """K splits so that ``tiles`` output tiles make about ``programs`` programs, each
    split keeping ``min_steps`` steps at least; none of them empty."""
    splits = max(1, min(triton.cdiv(programs, tiles), num_steps // min_steps))
    return triton.cdiv(num_steps, triton.cdiv(num_steps, splits))


def planes_linear_triton(
    x: torch.Tensor,
    weight: PlanarWeight,
    bias: torch.Tensor | None = None,
    *,
    tiles: PlanesTiles | None = None,
) -> torch.Tensor:
    """x [M, K] (fp16, bf16 or fp32) @ dequant(weight) [N, K]^T + bias [N] (fp32) ->
    [M, N] in x's dtype. ``tiles`` overrides the choice by rows (tests use it)."""
    out_features, in_features = weight.shape
    assert x.dim() == 2 and x.shape[1] == in_features, (x.shape, weight.shape)
    assert x.dtype in ACTIVATION_DTYPES, x.dtype
    assert x.device == weight.device, (x.device, weight.device)
    if x.stride(1) != 1:
        x = x.contiguous()
    if bias is not None:
        assert bias.dtype == torch.float32 and bias.shape == (out_features,), bias
        assert bias.is_contiguous()
    num_rows = x.shape[0]
    out = torch.empty((num_rows, out_features), dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out
    info = device_info(x)
    num_steps = triton.cdiv(in_features, STEP_VALUES)
    if tiles is None:
        tiles = choose_planes_tiles(info, num_rows, out_features, num_steps, weight.qtype)
    assert tiles.kernel != "dot" or tiles.block_m >= 16, tiles
    splits = tiles.num_splits
    steps_per_split = triton.cdiv(num_steps, splits)
    target = split_k_target(out, splits)
    add_bias = bias is not None and splits == 1  # else finish_split_k adds it
    if tiles.kernel == "words":
        assert weight.qtype in GEMV_WORD_TYPES, (tiles, weight.qtype)
        launch_planes_gemv_words(
            target,
            x,
            weight,
            bias if add_bias else None,
            tiles.block_m,
            tiles.block_n,
            splits,
            tiles.num_warps,
            tiles.unroll,
        )
        finish_split_k(out, target, bias)
        return out
    planes = [weight.planes.get(name, weight.planes["values"]) for name in PLANE_ARGS]
    for plane in planes:
        assert plane.stride(1) == 1, plane.stride()
    grid = (
        triton.cdiv(out_features, tiles.block_n),
        triton.cdiv(num_rows, tiles.block_m),
        splits,
    )
    args = (
        target,
        x,
        *planes,
        bias if add_bias else x,  # unused without a bias
        num_rows * out_features,
        out_features if splits > 1 else out.stride(0),
        x.stride(0),
        *(plane.stride(0) for plane in planes),
        num_rows,
        out_features,
        in_features // 32,
        num_steps,
        steps_per_split,
    )
    constants = dict(
        QTYPE=weight.qtype,
        HAS_OFFSET=weight.qtype in HAS_OFFSET,
        HAS_BIAS=add_bias,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    if tiles.kernel == "gemv":
        _planes_gemv_kernel[grid](*args, UNROLL=tiles.unroll, **constants)
    else:
        _planes_dot_kernel[grid](*args, DOT_FP32=dot_in_fp32(x.dtype, info), **constants)
    finish_split_k(out, target, bias)
    return out


# ---- the linear layer the model calls ----


class PlanesLinear:
    """x [..., in] @ weight^T + bias by the planes' kernels; the result in x's dtype.
    ``repacked_weight``: the planes, which the layer keeps in place of the file's
    blocks (kernels/triton_backend.py and the model's pack_weights)."""

    def __init__(self, weight: PlanarWeight, bias: torch.Tensor | None = None) -> None:
        self.repacked_weight = weight
        # The kernels add the bias in fp32: converted once here, not per call.
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = planes_linear_triton(x.reshape(-1, x.shape[-1]), self.repacked_weight, self.bias)
        return out.view(*x.shape[:-1], self.out_features)


def planes_linear(
    weight: QuantizedWeight | PlanarWeight, bias: torch.Tensor | None
) -> PlanesLinear:
    """The layer on ``weight``'s planes, repacking a file's blocks first (the file's
    bytes go with the caller's last reference to them)."""
    if isinstance(weight, QuantizedWeight):
        weight = pack_planes(weight)
    return PlanesLinear(weight, bias)


def planes_triton_takes(weight: object) -> bool:
    """Whether the planes' kernels take this weight: planes already, or GGUF blocks of a
    type the planes hold on a GPU. Blocks on the CPU in Triton's interpreter keep the
    file's kernel (the engine's interpreter tests); tests of the planes call
    ``planes_linear`` on them directly."""
    if isinstance(weight, PlanarWeight):
        return weight.device.type == "cuda" or interpreting()
    return isinstance(weight, QuantizedWeight) and weight.data.is_cuda and planes_take(weight)
