"""The planes' GEMV for decode (1-4 activation rows) on every type the planes hold
(kernels/quantized_planes.py), their values read as 32-bit words.

A GEMV streams the weight once, so its time should be the weight's bytes over the
memory's bandwidth; on an H200 the byte-wise GEMV (kernels/linear_planes_triton.py)
issued ~8 instructions per weight value (byte extraction, masks, an int-to-float
conversion, a multiply and a tree of adds per half) and took twice the memory's time.
Here a value costs about three:

- a LOP3 that keeps the value's nibble (or byte) where it lies in its 32-bit word and
  ORs in the exponent of 2^23, so that the word's bits are the float 2^23 + q 2^s (s:
  the field's bit offset, at most 16; the fields above are taken from the word shifted
  down once);
- an FMA that scales it back and takes the offset away at once: (2^23 + q 2^s) 2^-s -
  (2^23 2^-s + offset) is q - offset, exact in fp32 (every term is an integer of at
  most 24 bits times a power of two, and the result is exact, so the one rounding
  does nothing);
- an FMA that multiplies it by its activation into a running sum.

Each lane takes 16 bytes of a row (4 words: Q4_0's and Q4_1's block, a K-quant
super-block's eighth, half of Q8_0's block) and the program ``ROWS`` weight rows
against the same activations, which are loaded and converted once for all of them.
The sums are scaled per block (per sub-block in the K-quants) and reduced across lanes
once, at the end. Q8_0's bytes are made offset-binary (XOR 0x80) per word first;
the 5-bit and 6-bit types' values are put together a word at a time (the nibbles and
their top bits from the highs plane, a byte each) and then read as bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from hetero_infer.kernels.planes_decode_triton import load_f32
from hetero_infer.kernels.quantized_planes import PlanarWeight

# Every type of the planes (kernels/quantized_planes.py).
GEMV_WORD_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0")
CHUNK_BYTES = 16  # a lane's run of a row's values plane
# 2^23 as fp32 bits: ORed with a value kept in place, the float 2^23 + value.
MAGIC_BITS_VALUE = 0x4B000000
MAGIC = tl.constexpr(8388608.0)
SIGNS = tl.constexpr(-2139062144)  # 0x80808080: each byte's sign bit


def chunk_values(qtype: str) -> int:
    """Weight values in one chunk (16 bytes of the values plane)."""
    return 16 if qtype == "Q8_0" else 32


@triton.jit
def _in_place(src, magic, place: tl.constexpr, BITS: tl.constexpr, OFFSET: tl.constexpr):
    """The ``BITS``-bit field at ``place`` (0 or more, in fields) of each int32 in
    ``src``, less OFFSET, as fp32, exactly (see the module's docstring; the field must
    end below bit 23)."""
    shift: tl.constexpr = place * BITS
    field = src & (((1 << BITS) - 1) << shift)
    raw = (field | magic).to(tl.float32, bitcast=True)
    unit: tl.constexpr = 1.0 / (1 << shift)
    return raw * unit - (MAGIC * unit + OFFSET)


@triton.jit
def _split4(x):
    """x [..., 4] -> its 4 slices [...], in order (each lane holds all four)."""
    shape: tl.constexpr = x.shape[:-1] + [2, 2]
    x0, x1 = tl.split(tl.reshape(x, shape))
    x00, x10 = tl.split(x0)
    x01, x11 = tl.split(x1)
    return x00, x01, x10, x11


@triton.jit
def _word_sums(s, magic, x_row, at, x_mask, word, HALF: tl.constexpr, QTYPE: tl.constexpr):
    """s + the sum over one int32 word's 4 bytes of x * q (one FMA chain), q the bytes'
    values (Q8_0: the word made offset-binary; Q5_K, Q6_K: the values put together
    byte by byte) or their low (HALF 0) or high (HALF 1) nibbles; and the 4
    activations' sum. ``x_row + at``: the activations, contiguous. Byte b's low nibble
    is the word's nibble 2 b, its high one 2 b + 1."""
    x = tl.load(x_row + at, mask=x_mask, other=0.0).to(tl.float32)  # [BM, 1, C, 4]
    x0, x1, x2, x3 = _split4(x)
    if QTYPE == "Q8_0" or QTYPE == "Q5_0" or QTYPE == "Q5_1" or QTYPE == "Q5_K" or QTYPE == "Q6_K":
        # What the integers' offset is (Q8_0's made offset-binary; Q5_1's and Q5_K's
        # have a min instead).
        offset: tl.constexpr = (
            128.0
            if QTYPE == "Q8_0"
            else (16.0 if QTYPE == "Q5_0" else (32.0 if QTYPE == "Q6_K" else 0.0))
        )
        high = word.to(tl.uint32, bitcast=True) >> 16  # bytes 2 and 3 at places 0, 1
        s += x0 * _in_place(word, magic, 0, 8, offset)
        s += x1 * _in_place(word, magic, 1, 8, offset)
        s += x2 * _in_place(high, magic, 0, 8, offset)
        s += x3 * _in_place(high, magic, 1, 8, offset)
    else:
        # Nibble places 0-4 fit below the float's exponent as they lie; 5-7 are places
        # 2-4 of the word shifted down 12 bits.
        high = word.to(tl.uint32, bitcast=True) >> 12
        offset: tl.constexpr = 8.0 if QTYPE == "Q4_0" else 0.0
        if HALF == 0:  # byte b's low nibble: place 2 b
            s += x0 * _in_place(word, magic, 0, 4, offset)
            s += x1 * _in_place(word, magic, 2, 4, offset)
            s += x2 * _in_place(word, magic, 4, 4, offset)
            s += x3 * _in_place(high, magic, 3, 4, offset)
        else:  # its high nibble: place 2 b + 1
            s += x0 * _in_place(word, magic, 1, 4, offset)
            s += x1 * _in_place(word, magic, 3, 4, offset)
            s += x2 * _in_place(high, magic, 2, 4, offset)
            s += x3 * _in_place(high, magic, 4, 4, offset)
    return s, x0 + x1 + x2 + x3


@triton.jit
def _joined_bytes(word, tops, HALF: tl.constexpr, TOP_BITS: tl.constexpr, HIGH_AT: tl.constexpr):
    """The 5- and 6-bit types: the values of a word's low (HALF 0) or high (HALF 1)
    nibbles with their TOP_BITS top bits, a byte each: ``tops``, the highs word shifted
    so that byte b's top bits for its low nibble lie at bit 8 b, for its high one at
    8 b + HIGH_AT."""
    nibbles = word.to(tl.uint32, bitcast=True) >> (4 * HALF)
    shift: tl.constexpr = 4 - HIGH_AT * HALF
    top_mask: tl.constexpr = ((1 << TOP_BITS) - 1) * 0x01010101 << 4
    return ((nibbles & 0x0F0F0F0F) | ((tops << shift) & top_mask)).to(tl.int32, bitcast=True)


@triton.jit
def _spread(bits):
    """Bits 0-3 of each int32 -> bit 0 of its bytes 0-3 (the multiply's 16 shifted
    copies land on distinct bits, so nothing carries)."""
    return (bits * 0x204081) & 0x01010101


@triton.jit
def _planes_gemv_words_kernel(
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
    num_chunks,
    chunks_per_split,
    magic,
    QTYPE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """out[m, n] = sum_k x[m, k] dequant(w)[n, k] (+ bias[n]) over this program's
    chunks (a split's share: ``out`` its fp32 partial sums, ``stride_out_split``
    apart, no bias). Program (row tile, m tile, split); ``v_ptr`` and ``h_ptr``: the
    values and highs planes as int32 words; tiles [BLOCK_M, ROWS, CHUNKS], a lane a
    chunk."""
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    n_live = (cols < N)[None, :, None]  # [1, ROWS, 1]
    n_rows = cols.to(tl.int64)[None, :, None]
    x_row = x_ptr + rows.to(tl.int64)[:, None, None, None] * stride_x  # [BM, 1, 1, 1]
    m_live = (rows < M)[:, None, None, None]
    four = tl.arange(0, 4)

    acc = tl.zeros((BLOCK_M, ROWS, CHUNKS), dtype=tl.float32)
    first = tl.program_id(2) * chunks_per_split
    end = tl.minimum(first + chunks_per_split, num_chunks)
    for turn in range(first, end, CHUNKS):
        chunk = turn + tl.arange(0, CHUNKS)[None, None, :]  # [1, 1, C]
        live = chunk < end
        w_mask = n_live & live
        words = tl.load(
            v_ptr + (n_rows * stride_v + chunk * 4)[:, :, :, None] + four,
            mask=w_mask[:, :, :, None],
            other=0,
        )  # [1, ROWS, C, 4]: a lane's 16 bytes of each row
        if QTYPE == "Q8_0":
            words ^= SIGNS
        w = _split4(words)
        x_mask = m_live & live[:, :, :, None]
        # Where each word's 4 activations start (of its low nibbles' values where it
        # holds nibbles: the high ones' are HIGH further on).
        if QTYPE == "Q4_K" or QTYPE == "Q5_K":
            # Values byte 32 i + t: sub-block 2 i's value t (low nibble), 2 i + 1's (high).
            step = chunk // 8
            c = chunk % 8
            start = step * 256 + c // 2 * 64 + c % 2 * 16
            HIGH: tl.constexpr = 32
            if QTYPE == "Q5_K":  # sub-block b's value t: its fifth bit is bit b of byte t
                highs = tl.load(
                    h_ptr + (n_rows * stride_h + step * 8 + c % 2 * 4)[:, :, :, None] + four,
                    mask=w_mask[:, :, :, None],
                    other=0,
                )
                tops = _split4(highs.to(tl.uint32, bitcast=True) >> (c // 2 * 2)[:, :, :, None])
        elif QTYPE == "Q6_K":
            # Values byte 64 h + r: value 128 h + r (low nibble), 128 h + 64 + r (high);
            # highs byte 32 h + r: value 128 h + 32 u + r's top 2 bits at bits 2 u.
            step = chunk // 8
            c = chunk % 8
            start = step * 256 + c // 4 * 128 + c % 4 * 16
            HIGH: tl.constexpr = 64
            highs = tl.load(
                h_ptr
                + (n_rows * stride_h + step * 16 + c // 4 * 8 + c % 2 * 4)[:, :, :, None]
                + four,
                mask=w_mask[:, :, :, None],
                other=0,
            )
            # The chunk's low nibbles' bits at u = c % 4 // 2, the high ones' at u + 2.
            tops = _split4(highs.to(tl.uint32, bitcast=True) >> (c % 4 // 2 * 2)[:, :, :, None])
        else:
            start = chunk * (16 if QTYPE == "Q8_0" else 32)
            HIGH: tl.constexpr = 16
            if QTYPE == "Q5_0" or QTYPE == "Q5_1":  # bit t of the block's int32: value t's fifth
                fifths = tl.load(h_ptr + n_rows * stride_h + chunk, mask=w_mask, other=0)
                fifths = fifths.to(tl.uint32, bitcast=True)
        start = start[:, :, :, None] + four  # [1, 1, C, 4]
        s_lo = tl.zeros((BLOCK_M, ROWS, CHUNKS), dtype=tl.float32)
        s_hi = tl.zeros((BLOCK_M, ROWS, CHUNKS), dtype=tl.float32)
        x_lo = tl.zeros((BLOCK_M, 1, CHUNKS), dtype=tl.float32)
        x_hi = tl.zeros((BLOCK_M, 1, CHUNKS), dtype=tl.float32)
        for i in tl.static_range(4):
            lo, hi = w[i], w[i]
            if QTYPE == "Q5_0" or QTYPE == "Q5_1":
                # Word i holds values 4 i + b (low nibbles) and 16 + 4 i + b (high).
                low_tops = _spread((fifths >> (4 * i)) & 15)
                high_tops = _spread((fifths >> (16 + 4 * i)) & 15)
                tops_i = low_tops | (high_tops << 1)
                lo, hi = _joined_bytes(w[i], tops_i, 0, 1, 1), _joined_bytes(w[i], tops_i, 1, 1, 1)
            elif QTYPE == "Q5_K":
                lo, hi = (
                    _joined_bytes(w[i], tops[i], 0, 1, 1),
                    _joined_bytes(w[i], tops[i], 1, 1, 1),
                )
            elif QTYPE == "Q6_K":
                lo, hi = (
                    _joined_bytes(w[i], tops[i], 0, 2, 4),
                    _joined_bytes(w[i], tops[i], 1, 2, 4),
                )
            s_lo, x_sum = _word_sums(s_lo, magic, x_row, start + 4 * i, x_mask, lo, 0, QTYPE)
            x_lo += x_sum
            if QTYPE != "Q8_0":
                at = start + (4 * i + HIGH)
                if QTYPE == "Q4_0" or QTYPE == "Q5_0":  # one scale, no min: one chain
                    s_lo, _ = _word_sums(s_lo, magic, x_row, at, x_mask, hi, 1, QTYPE)
                else:
                    s_hi, x_sum = _word_sums(s_hi, magic, x_row, at, x_mask, hi, 1, QTYPE)
                    x_hi += x_sum
        if QTYPE == "Q4_K" or QTYPE == "Q5_K":
            # Sub-block 2 (c // 2) holds the low nibbles, the next one the high ones.
            sub = step * 8 + c // 2 * 2
            d = load_f32(d_ptr + n_rows * stride_d + step, w_mask)
            dmin = load_f32(dm_ptr + n_rows * stride_dm + step, w_mask)
            scales = s_ptr + n_rows * stride_s + sub
            mins = m_ptr + n_rows * stride_m + sub
            acc += d * (s_lo * load_f32(scales, w_mask) + s_hi * load_f32(scales + 1, w_mask))
            acc -= dmin * (x_lo * load_f32(mins, w_mask) + x_hi * load_f32(mins + 1, w_mask))
        elif QTYPE == "Q6_K":
            sub = step * 16 + c // 4 * 8 + c % 4  # the low nibbles' 16; the high ones' 4 on
            d = load_f32(d_ptr + n_rows * stride_d + step, w_mask)
            scales = s_ptr + n_rows * stride_s + sub
            acc += d * (s_lo * load_f32(scales, w_mask) + s_hi * load_f32(scales + 4, w_mask))
        else:
            block = chunk // 2 if QTYPE == "Q8_0" else chunk
            scale = load_f32(s_ptr + n_rows * stride_s + block, w_mask)
            if QTYPE == "Q4_1" or QTYPE == "Q5_1":
                mins = load_f32(m_ptr + n_rows * stride_m + block, w_mask)
                acc += (s_lo + s_hi) * scale + (x_lo + x_hi) * mins
            else:  # s_lo is all (Q8_0 has no high nibbles; adding a zero s_hi costs an add)
                acc += s_lo * scale
    y = tl.sum(acc, axis=2)  # [BLOCK_M, ROWS]
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=cols < N, other=0.0)[None, :]
    dst = out_ptr + tl.program_id(2) * stride_out_split
    dst += rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(dst, y.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & (cols < N)[None, :])


def launch_planes_gemv_words(
    target: torch.Tensor,
    x: torch.Tensor,
    weight: PlanarWeight,
    bias: torch.Tensor | None,
    block_m: int,
    rows: int,
    num_splits: int,
    num_warps: int,
    unroll: int,
) -> None:
    """x [M, K] @ dequant(weight)^T (+ bias, one split only) into ``target``: [M, N],
    or fp32 [num_splits, M, N] partial sums. A program takes ``rows`` weight rows and
    ``unroll`` chunks a lane a loop turn."""
    planes = weight.planes
    values = planes["values"]
    words = values.view(torch.int32)  # the rows are 16-byte multiples
    num_chunks = values.shape[1] * values.element_size() // CHUNK_BYTES
    # The 5- and 6-bit types' highs (a placeholder for the others, unused).
    highs = planes.get("highs", values).view(torch.int32)
    others = [planes.get(name, values) for name in ("scales", "mins", "d", "dmin")]
    num_rows, out_features = x.shape[0], weight.shape[0]
    grid = (triton.cdiv(out_features, rows), triton.cdiv(num_rows, block_m), num_splits)
    _planes_gemv_words_kernel[grid](
        target,
        x,
        words,
        highs,
        *others,
        x if bias is None else bias,  # unused without a bias
        num_rows * out_features,
        out_features if num_splits > 1 else target.stride(0),
        x.stride(0),
        words.stride(0),
        highs.stride(0),
        *(plane.stride(0) for plane in others),
        num_rows,
        out_features,
        num_chunks,
        triton.cdiv(num_chunks, num_splits),
        # A runtime value, not a constant: the compiler then keeps it in a register
        # and makes each value one LOP3 with its mask as the immediate (as a constant
        # it took the immediate slot, and each mask cost a move as well).
        MAGIC_BITS_VALUE,
        QTYPE=weight.qtype,
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        ROWS=rows,
        CHUNKS=32 * num_warps * unroll,
        num_warps=num_warps,
        num_stages=1,
    )
