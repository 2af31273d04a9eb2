"""Decoding GGUF planes (kernels/quantized_planes.py) in Triton: a chunk of 32 values
of a step of 256, as two halves of 16, and the activations each half multiplies. The
kernels that use them are in kernels/linear_planes_triton.py."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_f32(ptrs, mask):
    return tl.load(ptrs, mask=mask, other=0).to(tl.float32)


@triton.jit
def decode_chunk(
    v_rows, h_rows, s_rows, m_rows, d_rows, dm_rows, step, c, j, mask, QTYPE: tl.constexpr
):
    """Chunk ``c`` (0-7) of step ``step``: (q_lo, q_hi) the integers of its two halves,
    int32, of the shape of rows x c x j; (s_lo, s_hi, o_lo, o_hi) their scales and
    offsets, fp32, of the shape of rows x c (o_*: meaningful in HAS_OFFSET types only).
    ``*_rows``: each plane's row starts; ``c`` a constexpr or a tensor of chunks; ``j``
    0-15 along the axis the halves' values lie on; ``mask``: live rows (and chunks).

    Q4_0-Q5_1: chunk c is block 8 step + c; byte j of its 16 holds value j (low
    nibble) and j + 16 (high); Q5's fifth bit of value t is bit t of the block's int32.
    Q4_K/Q5_K: bytes 32 i + t hold sub-block 2 i's value t (low) and 2 i + 1's (high);
    Q5_K's fifth bit of sub-block b's value t is bit b of highs byte t. Q6_K: values
    byte 64 h + r holds value 128 h + r (low) and 128 h + 64 + r (high); value
    128 h + 32 u + r has its top 2 bits at bits 2 u of highs byte 32 h + r."""
    if QTYPE == "Q4_K" or QTYPE == "Q5_K":
        b = tl.load(v_rows + step * 128 + c * 16 + j, mask=mask, other=0).to(tl.int32)
        q_lo = b & 15
        q_hi = b >> 4
        if QTYPE == "Q5_K":
            fifth = tl.load(h_rows + step * 32 + (c % 2) * 16 + j, mask=mask, other=0)
            fifth = fifth.to(tl.int32) >> (c // 2 * 2)
            q_lo |= (fifth & 1) << 4
            q_hi |= ((fifth >> 1) & 1) << 4
        d = load_f32(d_rows + step, mask)
        dmin = load_f32(dm_rows + step, mask)
        sub = step * 8 + c // 2 * 2  # the low half's sub-block
        s_lo = d * load_f32(s_rows + sub, mask)
        s_hi = d * load_f32(s_rows + sub + 1, mask)
        o_lo = -dmin * load_f32(m_rows + sub, mask)
        o_hi = -dmin * load_f32(m_rows + sub + 1, mask)
    elif QTYPE == "Q6_K":
        b = tl.load(v_rows + step * 128 + c * 16 + j, mask=mask, other=0).to(tl.int32)
        high = tl.load(h_rows + step * 64 + c // 4 * 32 + (c % 2) * 16 + j, mask=mask, other=0)
        high = high.to(tl.int32) >> ((c % 4) // 2 * 2)
        q_lo = ((b & 15) | ((high & 3) << 4)) - 32
        q_hi = ((b >> 4) | (((high >> 4) & 3) << 4)) - 32
        d = load_f32(d_rows + step, mask)
        sub = step * 16 + c // 4 * 8 + c % 4  # the low half's scale; the high's 4 on
        s_lo = d * load_f32(s_rows + sub, mask)
        s_hi = d * load_f32(s_rows + sub + 4, mask)
        o_lo = s_lo
        o_hi = s_hi
    else:
        block = step * 8 + c
        if QTYPE == "Q8_0":
            q_lo = tl.load(v_rows + block * 32 + j, mask=mask, other=0).to(tl.int32)
            q_hi = tl.load(v_rows + block * 32 + 16 + j, mask=mask, other=0).to(tl.int32)
        else:
            b = tl.load(v_rows + block * 16 + j, mask=mask, other=0).to(tl.int32)
            q_lo = b & 15
            q_hi = b >> 4
            if QTYPE == "Q5_0" or QTYPE == "Q5_1":
                fifth = tl.load(h_rows + block, mask=mask, other=0)
                q_lo |= ((fifth >> j) & 1) << 4
                q_hi |= ((fifth >> (j + 16)) & 1) << 4
            if QTYPE == "Q4_0":
                q_lo -= 8
                q_hi -= 8
            elif QTYPE == "Q5_0":
                q_lo -= 16
                q_hi -= 16
        s_lo = load_f32(s_rows + block, mask)
        s_hi = s_lo
        o_lo = s_lo
        if QTYPE == "Q4_1" or QTYPE == "Q5_1":
            o_lo = load_f32(m_rows + block, mask)
        o_hi = o_lo
    return q_lo, q_hi, s_lo, s_hi, o_lo, o_hi


@triton.jit
def load_x_chunk(x_rows, step, c, j, mask, QTYPE: tl.constexpr):
    """The activations chunk ``c``'s two halves multiply (see decode_chunk for the order)."""
    if QTYPE == "Q4_K" or QTYPE == "Q5_K":
        lo = c // 2 * 64 + (c % 2) * 16
        hi = lo + 32
    elif QTYPE == "Q6_K":
        lo = c // 4 * 128 + (c % 4) * 16
        hi = lo + 64
    else:
        lo = c * 32
        hi = lo + 16
    start = x_rows + step * 256
    x_lo = tl.load(start + lo + j, mask=mask, other=0.0)
    x_hi = tl.load(start + hi + j, mask=mask, other=0.0)
    return x_lo, x_hi


# 1.5 * 2^23: a float whose mantissa's unit is 1; as an int32, the same float's bits.
MAGIC_FLOAT = tl.constexpr(12582912.0)
MAGIC_BITS = tl.constexpr(0x4B400000)


@triton.jit
def integers_to_f32(q):
    """int32 q (|q| < 2^22) -> fp32, exactly, by an integer add and a float subtract:
    the bits of 1.5 * 2^23 plus q are the float 1.5 * 2^23 + q. A conversion
    instruction (I2F) issues at a fraction of the FMA's rate, and the GEMV converts
    every value it multiplies. (tl.dot's operands are left to the compiler: for int8 it
    converts without I2F.)"""
    return (q + MAGIC_BITS).to(tl.float32, bitcast=True) - MAGIC_FLOAT


@triton.jit
def dot_integers(x, q, FP32: tl.constexpr):
    """x [BLOCK_M, 16] @ integer q [16, BLOCK_N] -> fp32; q is exact in x's 16-bit
    dtype, fp32 operands multiply in full IEEE precision (no TF32)."""
    if FP32:
        return tl.dot(x.to(tl.float32), q.to(tl.float32), input_precision="ieee")
    return tl.dot(x, q.to(x.dtype))
