"""GGUF blocks dequantized in torch: the values gguf-py's numpy code gives, bit for bit
(the same fp32 operations in the same order), some 20x faster. The loaders take it to
dequantize a file's weights, and ``dequantize_rows`` to look up rows of a quantized
embedding. The types here are the blocks of 32 and the K-quants of the common Q4_K_M
and Q6_K files; gguf-py dequantizes the others.
"""

from __future__ import annotations

import torch

# Values per block, by type.
BLOCK_VALUES = {
    "Q8_0": 32,
    "Q4_0": 32,
    "Q4_1": 32,
    "Q5_0": 32,
    "Q5_1": 32,
    "Q4_K": 256,
    "Q6_K": 256,
}
TORCH_TYPES = tuple(BLOCK_VALUES)


def dequantize_blocks(qtype: str, blocks: torch.Tensor) -> torch.Tensor:
    """Blocks [n, bytes a block] (uint8) of ``qtype`` -> their values [n, BLOCK_VALUES]
    in fp32."""
    if qtype == "Q4_K":
        return _q4_k(blocks)
    if qtype == "Q6_K":
        return _q6_k(blocks)
    return _blocks_of_32(qtype, blocks)


def _halves(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at byte ``start`` of each block, as fp32 [n, 1]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(data: torch.Tensor, width: int) -> torch.Tensor:
    """Runs of ``width`` bytes -> their low nibbles, then their high ones (uint8)."""
    n, size = data.shape
    runs = data.reshape(n, size // width, 1, width)
    return torch.cat((runs & 0x0F, runs >> 4), dim=2).reshape(n, 2 * size)


def _blocks_of_32(qtype: str, blocks: torch.Tensor) -> torch.Tensor:
    has_min = qtype in ("Q4_1", "Q5_1")
    five_bits = qtype in ("Q5_0", "Q5_1")
    # Before a block's values: its fp16 scale, fp16 min, 4 bytes of fifth bits.
    head = 2 + 2 * has_min + 4 * five_bits
    scale = _halves(blocks, 0)
    if qtype == "Q8_0":
        return blocks[:, head:].contiguous().view(torch.int8).float() * scale
    # Byte j of a block's 16 holds value j in its low nibble and j + 16 in its high.
    values = _nibbles(blocks[:, head:], 16)
    if five_bits:
        # Value j's fifth bit: bit j of the little-endian uint32 before the nibbles.
        bits = torch.arange(8, dtype=torch.uint8, device=blocks.device)
        highs = blocks[:, head - 4 : head, None] >> bits
        values = values | (highs & 1).flatten(1) << 4
    values = values.float()
    if not has_min:  # stored unsigned, offset by half their range
        values = values - (16.0 if five_bits else 8.0)
    values = values * scale
    return values + _halves(blocks, 2) if has_min else values


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    """256 values: 8 sub-blocks of 32, each with a 6-bit scale and min of the block's
    fp16 d and dmin, packed in 12 bytes."""
    n = blocks.shape[0]
    d, dmin = _halves(blocks, 0), _halves(blocks, 2)
    packed = blocks[:, 4:16].reshape(n, 3, 4)
    low, high, rest = packed[:, 0], packed[:, 1], packed[:, 2]
    scales = torch.cat((low & 0x3F, (rest & 0x0F) | ((low >> 2) & 0x30)), dim=1)
    mins = torch.cat((high & 0x3F, (rest >> 4) | ((high >> 2) & 0x30)), dim=1)
    step = (d * scales.float()).reshape(n, 8, 1)
    offset = (dmin * mins.float()).reshape(n, 8, 1)
    values = _nibbles(blocks[:, 16:], 32).reshape(n, 8, 32).float()
    return (step * values - offset).reshape(n, 256)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """256 values of 6 bits: low nibbles (128 bytes), high 2-bit pairs (64 bytes), an
    int8 scale per 16 values (16 bytes), the block's fp16 d."""
    n = blocks.shape[0]
    step = (_halves(blocks, 208) * blocks[:, 192:208].view(torch.int8).float()).reshape(n, 16, 1)
    low = _nibbles(blocks[:, :128], 64).reshape(n, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=blocks.device).reshape(1, 1, 4, 1)
    high = ((blocks[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 0x03).reshape(n, 8, 32)
    values = (low | (high << 4)).view(torch.int8) - 32
    return (step * values.reshape(n, 16, 16).float()).reshape(n, 256)
