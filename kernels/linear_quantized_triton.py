"""Triton linear layers on quantized weights: the GPU side of kernels/linear_quantized.py.

y [M, N] = x [M, K] @ dequant(W) [N, K]^T (+ bias), for GGUF blocks (Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) and weight-only int8 (I8), read as the file stores them.
No repacked copy: the model keeps the blocks themselves (the Linear's weight, the
embedding's rows for lookups and the tied lm_head), so a copy would double what the
weights take on the GPU. The price: Q8_0's 34-byte, Q5_0's 22-byte and Q6_K's 210-byte
blocks leave their fields 2-aligned at best, so the loads are byte-wide rather than
16-byte vectors. So on a GPU the GGUF types go instead into kernels/quantized_planes.py's
planes, made at load in place of the blocks (kernels/linear_planes_triton.py): this
kernel keeps int8 rows, and the blocks in Triton's interpreter. The bytes of one output
row are a run of blocks; a program reads its tile's rows a step of K at a time, decodes
the blocks in registers and multiplies them.

Each block's (Q6_K: each 16 values') integers go into tl.dot as they are, exact in
fp16 and bf16 (|q| <= 128), and the block's scale multiplies the fp32 product; a min
(Q4_1, Q5_1, Q4_K, Q5_K) adds min * sum(x) over the block. So the result differs from
``x @ dequantize(W)^T`` in fp64 by fp32 rounding only, and a bf16 step does not round
the dequantized weight to bf16 on the way:

    y[m, n] = sum over blocks b of  d[n, b] * sum_k x[m, k] q[n, k]  (+ min[n, b] * sum_k x[m, k])

Decode (M <= 16) reads every weight byte once per step and little else, so it is bound
by memory bandwidth: the tiles are small along N (many programs), and where the output
tiles alone leave SMs idle the K loop is split across programs whose fp32 partial sums
are added afterwards (split-K). Larger M takes 64 x 64 tiles. Tile sizes come from the
device (kernels/triton_utils.py), not from autotuning.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from hetero_infer.kernels.quantized import INT8, QUANT_TYPES, QuantizedWeight
from hetero_infer.kernels.triton_utils import (
    DeviceInfo,
    check_last_dim_contiguous,
    device_info,
    dot_in_fp32,
    finish_split_k,
    interpreting,
    next_pow2,
    split_k_target,
)

# Bytes of one block in the file (llama.cpp's layouts), by type; I8 has no blocks.
BLOCK_BYTES = {
    "Q8_0": 34,
    "Q4_0": 18,
    "Q4_1": 20,
    "Q5_0": 22,
    "Q5_1": 24,
    "Q4_K": 144,
    "Q5_K": 176,
    "Q6_K": 210,
    INT8: 1,
}
# Values of K per step of the kernel's loop, every type: a K-quant's super-block, 8 of
# the other GGUF types' 32-value blocks (unrolled, so that their loads are in flight
# together; a row's last step may hold fewer), I8's 256 values (the last masked).
STEP_VALUES = 256
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---- decoding ----


@triton.jit
def _load_fp16(ptrs, mask):
    """An fp16 field of a block (two little-endian bytes at ``ptrs``) as fp32; bytewise,
    since the blocks of Q8_0 (34 bytes) or Q6_K (210) leave fields only 2-aligned."""
    low = tl.load(ptrs, mask=mask, other=0).to(tl.uint16)
    high = tl.load(ptrs + 1, mask=mask, other=0).to(tl.uint16)
    return (low | (high << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _load_byte(ptrs, mask):
    return tl.load(ptrs, mask=mask, other=0).to(tl.int32)


@triton.jit
def _dot(x, q, FP32: tl.constexpr):
    """x [BLOCK_M, k] @ integer q [k, BLOCK_N] -> fp32; q is exact in x's 16-bit dtype,
    fp32 operands multiply in full IEEE precision (no TF32)."""
    if FP32:
        return tl.dot(x.to(tl.float32), q.to(tl.float32), input_precision="ieee")
    return tl.dot(x, q.to(x.dtype))


@triton.jit
def _q4_k_scale_min(scales, J: tl.constexpr, mask):
    """Sub-block J's 6-bit scale and min from a Q4_K super-block's 12 packed bytes: the
    first four sub-blocks have theirs in the low 6 bits of bytes J and J + 4; the last
    four take 4 bits from byte J + 4 and their top 2 bits from the first four's."""
    if J < 4:
        scale = _load_byte(scales + J, mask) & 63
        min_ = _load_byte(scales + J + 4, mask) & 63
    else:
        packed = _load_byte(scales + J + 4, mask)
        scale = (packed & 0xF) | ((_load_byte(scales + J - 4, mask) >> 6) << 4)
        min_ = (packed >> 4) | ((_load_byte(scales + J, mask) >> 6) << 4)
    return scale.to(tl.float32), min_.to(tl.float32)


@triton.jit
def _small_blocks_step(
    acc,
    x_rows,
    w_rows,
    step,
    num_blocks,
    row_mask,
    col_mask,
    QTYPE: tl.constexpr,
    BYTES: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """One step's 8 blocks of 32 values (Q8_0: fp16 d, 32 int8; Q4_0: fp16 d, 16 bytes of
    nibbles minus 8; Q4_1: fp16 d, fp16 min, 16 bytes of nibbles; Q5_0 and Q5_1: Q4_0's
    and Q4_1's with 4 bytes of fifth bits before the nibbles, Q5_0's minus 16). Byte j of
    the nibbles holds value j in its low nibble and value j + 16 in its high one; value
    j's fifth bit is bit j of the little-endian uint32 (bit j % 8 of byte j // 8)."""
    t = tl.arange(0, 32)
    for j in tl.static_range(8):  # 8 blocks of 32: a step of STEP_VALUES
        block = step * 8 + j
        # The row's last step may end early. (A tensor, not a scalar: the interpreter's
        # loop index is a Python int.)
        live = tl.full((1, 1), block, tl.int32) < num_blocks
        head = w_rows + block * BYTES  # [1, BLOCK_N]: each output's block
        w_mask = col_mask & live
        x = tl.load(x_rows + block * 32 + t[None, :], mask=row_mask & live, other=0.0)
        d = _load_fp16(head, w_mask)
        if QTYPE == "Q8_0":
            q = tl.load(head + 2 + t[:, None], mask=w_mask, other=0)
            q = q.to(tl.int8, bitcast=True).to(tl.int32)  # [32, BLOCK_N]
        else:
            # The nibbles end the block, after d, the min and the fifth bits.
            nibbles = _load_byte(head + BYTES - 16 + (t % 16)[:, None], w_mask)
            q = (nibbles >> (t // 16 * 4)[:, None]) & 0xF  # [32, BLOCK_N]
            if QTYPE == "Q5_0" or QTYPE == "Q5_1":
                fifth = _load_byte(head + BYTES - 20 + (t // 8)[:, None], w_mask)
                q |= ((fifth >> (t % 8)[:, None]) & 1) << 4
            if QTYPE == "Q4_0":
                q -= 8
            elif QTYPE == "Q5_0":
                q -= 16
        acc += _dot(x, q, DOT_FP32) * d
        if QTYPE == "Q4_1" or QTYPE == "Q5_1":
            acc += tl.sum(x.to(tl.float32), axis=1)[:, None] * _load_fp16(head + 2, w_mask)
    return acc


@triton.jit
def _q4_k_q5_k_step(
    acc,
    x_rows,
    w_rows,
    step,
    row_mask,
    col_mask,
    QTYPE: tl.constexpr,
    BYTES: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """One Q4_K super-block of 256 values (144 bytes): fp16 d, fp16 dmin, 12 bytes of
    6-bit scales and mins for its 8 sub-blocks of 32, 128 bytes of nibbles. Sub-blocks
    2i and 2i + 1 share bytes 32i..32i+31, low nibbles then high; a value is
    d * scale * q - dmin * min. Q5_K's (176 bytes) has 32 bytes of fifth bits before the
    nibbles: value i of sub-block j has its fifth bit in bit j of byte i."""
    t = tl.arange(0, 32)
    head = w_rows + step * BYTES  # [1, BLOCK_N]
    d = _load_fp16(head, col_mask)
    dmin = _load_fp16(head + 2, col_mask)
    nibbles_at = head + BYTES - 128
    if QTYPE == "Q5_K":
        fifth = _load_byte(head + 16 + t[:, None], col_mask)  # [32, BLOCK_N]
    for j in tl.static_range(8):
        x = tl.load(x_rows + step * 256 + j * 32 + t[None, :], mask=row_mask, other=0.0)
        nibbles = _load_byte(nibbles_at + (j // 2) * 32 + t[:, None], col_mask)
        q = (nibbles >> (j % 2) * 4) & 0xF  # [32, BLOCK_N]
        if QTYPE == "Q5_K":
            q |= ((fifth >> j) & 1) << 4
        scale, min_ = _q4_k_scale_min(head + 4, j, col_mask)
        acc += _dot(x, q, DOT_FP32) * (d * scale)
        acc -= tl.sum(x.to(tl.float32), axis=1)[:, None] * (dmin * min_)
    return acc


@triton.jit
def _q6_k_step(acc, x_rows, w_rows, step, row_mask, col_mask, DOT_FP32: tl.constexpr):
    """One Q6_K super-block of 256 values (210 bytes): 128 bytes of low nibbles, 64 of
    2-bit highs, 16 int8 scales (one per 16 values), fp16 d. Value v = 128 h + r
    (h: which half) has its low 4 bits in byte 64 h + r % 64 (high nibble when r >= 64)
    and its top 2 in byte 128 + 32 h + r % 32 (bits 2 (r // 32)); it is
    d * scale[v // 16] * (q - 32)."""
    t = tl.arange(0, 16)
    head = w_rows + step * 210  # [1, BLOCK_N]
    d = _load_fp16(head + 208, col_mask)
    for s in tl.static_range(16):
        half = s // 8
        low = _load_byte(head + half * 64 + (s % 4) * 16 + t[:, None], col_mask)
        high = _load_byte(head + 128 + half * 32 + (s % 2) * 16 + t[:, None], col_mask)
        low = (low >> ((s % 8) // 4) * 4) & 0xF
        high = (high >> ((s % 8) // 2) * 2) & 3
        q = (low | (high << 4)) - 32  # [16, BLOCK_N]
        scale = tl.load(head + 192 + s, mask=col_mask, other=0).to(tl.int8, bitcast=True)
        x = tl.load(x_rows + step * 256 + s * 16 + t[None, :], mask=row_mask, other=0.0)
        acc += _dot(x, q, DOT_FP32) * (d * scale.to(tl.float32))
    return acc


@triton.jit
def _int8_step(acc, x_rows, w_rows, step, K, row_mask, col_mask, DOT_FP32: tl.constexpr):
    """256 values of int8 rows; the per-row scale is applied once, after the K loop."""
    k = step * 256 + tl.arange(0, 256)
    live = k < K
    x = tl.load(x_rows + k[None, :], mask=row_mask & live[None, :], other=0.0)
    q = tl.load(w_rows + k[:, None], mask=col_mask & live[:, None], other=0)
    return acc + _dot(x, q.to(tl.int32), DOT_FP32)


# ---- the kernel ----


@triton.jit
def _quantized_linear_kernel(
    out_ptr,
    x_ptr,
    w_ptr,
    scales_ptr,
    bias_ptr,
    stride_out_split,
    stride_out,
    stride_x,
    stride_w,
    M,
    N,
    K,
    num_steps,
    steps_per_split,
    QTYPE: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """out[m, n] = sum_k x[m, k] * dequant(w)[n, k] (+ bias[n]) over this program's
    steps of K (all of them, or one split's share: then ``out`` is the split's fp32
    partial sums, ``stride_out_split`` apart, and HAS_BIAS is off).

    Program (n tile, m tile, split); w_ptr: the weight's bytes [N, row bytes] (I8:
    int8 [N, K]); scales_ptr: I8's fp32 [N]; bias_ptr: fp32 [N].
    """
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = (rows < M)[:, None]  # [BLOCK_M, 1]
    col_mask = (cols < N)[None, :]  # [1, BLOCK_N]
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x  # [BLOCK_M, 1]
    w_rows = w_ptr + cols.to(tl.int64)[None, :] * stride_w  # [1, BLOCK_N]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = tl.program_id(2) * steps_per_split
    for step in range(first, tl.minimum(first + steps_per_split, num_steps)):
        if QTYPE == "Q4_K" or QTYPE == "Q5_K":
            acc = _q4_k_q5_k_step(
                acc, x_rows, w_rows, step, row_mask, col_mask, QTYPE, BLOCK_BYTES, DOT_FP32
            )
        elif QTYPE == "Q6_K":
            acc = _q6_k_step(acc, x_rows, w_rows, step, row_mask, col_mask, DOT_FP32)
        elif QTYPE == "I8":
            acc = _int8_step(acc, x_rows, w_rows, step, K, row_mask, col_mask, DOT_FP32)
        else:
            acc = _small_blocks_step(
                acc, x_rows, w_rows, step, K // 32, row_mask, col_mask, QTYPE, BLOCK_BYTES, DOT_FP32
            )
    if QTYPE == "I8":
        acc *= tl.load(scales_ptr + cols, mask=cols < N, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0)[None, :]
    dst = out_ptr + tl.program_id(2) * stride_out_split
    dst += rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=row_mask & col_mask)


# ---- launching ----


@dataclass(frozen=True)
class QuantizedTiles:
    block_m: int  # activation rows per program (tl.dot needs >= 16)
    block_n: int  # outputs per program
    num_splits: int  # programs along K per output tile (split-K), 1: none
    num_warps: int
    num_stages: int


def choose_tiles(
    info: DeviceInfo, num_rows: int, out_features: int, num_steps: int
) -> QuantizedTiles:
    """Tile sizes for this device and shape; no autotuning (see kernels/triton_utils.py)."""
    if info.interpreter:
        # Cost is per program and per loop step: few programs, wide tiles.
        block_m = max(16, min(64, next_pow2(num_rows)))
        return QuantizedTiles(block_m, max(16, min(128, next_pow2(out_features))), 1, 4, 1)
    if num_rows > 16:
        block_m = 32 if num_rows <= 32 else 64
        return QuantizedTiles(block_m, 64, 1, 4, 2)
    # Decode: bound by reading the weight, so 32 outputs a program and, where that
    # leaves SMs idle (narrow layers), K split until about two programs per SM, each
    # split keeping at least two steps of 256 values.
    tiles = triton.cdiv(out_features, 32)
    splits = max(1, min(triton.cdiv(2 * info.num_sms, tiles), num_steps // 2))
    splits = triton.cdiv(num_steps, triton.cdiv(num_steps, splits))  # no empty split
    return QuantizedTiles(16, 32, splits, 4, 2)


def loop_steps(weight: QuantizedWeight) -> int:
    """Steps of the kernel's K loop for this weight: STEP_VALUES values each."""
    return triton.cdiv(weight.shape[1], STEP_VALUES)


def quantized_linear_triton(
    x: torch.Tensor,
    weight: QuantizedWeight,
    bias: torch.Tensor | None = None,
    *,
    tiles: QuantizedTiles | None = None,
) -> torch.Tensor:
    """x [M, K] (fp16, bf16 or fp32) @ dequant(weight) [N, K]^T + bias [N] (fp32) ->
    [M, N] in x's dtype. ``tiles`` overrides the per-device choice (tests use it to
    cover several programs and the split-K path)."""
    out_features, in_features = weight.shape
    assert x.dim() == 2 and x.shape[1] == in_features, (x.shape, weight.shape)
    assert x.dtype in ACTIVATION_DTYPES, x.dtype
    assert x.device == weight.data.device, (x.device, weight.data.device)
    check_last_dim_contiguous("weight", weight.data)
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
    num_steps = loop_steps(weight)
    if tiles is None:
        tiles = choose_tiles(info, num_rows, out_features, num_steps)
    assert tiles.block_m >= 16 and tiles.block_n >= 16, tiles
    splits = tiles.num_splits
    steps_per_split = triton.cdiv(num_steps, splits)
    target = split_k_target(out, splits)
    scales = weight.scales if weight.qtype == INT8 else None
    if scales is not None:
        assert scales.dtype == torch.float32 and scales.is_contiguous(), scales
    grid = (
        triton.cdiv(out_features, tiles.block_n),
        triton.cdiv(num_rows, tiles.block_m),
        splits,
    )
    _quantized_linear_kernel[grid](
        target,
        x,
        weight.data,
        scales if scales is not None else x,  # unused but for I8
        bias if bias is not None and splits == 1 else x,  # unused without a bias
        num_rows * out_features,
        out_features if splits > 1 else out.stride(0),
        x.stride(0),
        weight.data.stride(0),
        num_rows,
        out_features,
        in_features,
        num_steps,
        steps_per_split,
        QTYPE=weight.qtype,
        BLOCK_BYTES=BLOCK_BYTES[weight.qtype],
        HAS_BIAS=bias is not None and splits == 1,
        DOT_FP32=dot_in_fp32(x.dtype, info),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    finish_split_k(out, target, bias)
    return out


# ---- the linear layer the model calls ----


class TritonQuantizedLinear:
    """x [..., in] @ weight^T + bias by the Triton kernel on the weight's own bytes; the
    result in x's dtype."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> None:
        assert triton_quantized_takes(weight), (weight.qtype, weight.shape, weight.data.device)
        self.weight = weight
        # The kernel adds the bias in fp32: converted once here, not per call.
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = quantized_linear_triton(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
        return out.view(*x.shape[:-1], self.out_features)


def triton_quantized_takes(weight: QuantizedWeight) -> bool:
    """Whether the Triton kernel takes this weight: a type it decodes, row-contiguous
    bytes (I8: with its fp32 scales beside them), on the device the kernels run on (a
    GPU; the CPU only in Triton's interpreter). Block sizes need nothing more: a GGUF
    row is whole blocks, and I8 rows of any length are masked."""
    data = weight.data
    on_device = data.is_cuda or (data.is_cpu and interpreting())
    if weight.qtype not in QUANT_TYPES or not on_device or data.dim() != 2:
        return False
    if data.stride(1) != 1 or min(weight.shape) == 0:
        return False
    if weight.qtype == INT8:
        scales = weight.scales
        return (
            scales is not None
            and scales.dtype == torch.float32
            and scales.is_contiguous()
            and scales.device == data.device
        )
    return True
