"""The GPU's layout for GGUF blocks: each field of a type's blocks in a plane of its own.

A file's block interleaves a scale (2 bytes) with its values (16 or 32 bytes), so Q8_0's
34-byte and Q4_0's 18-byte blocks leave the values 2-aligned and a GPU lane reads them
a byte or two at a time. Here the values of all of a row's blocks are one run of bytes,
the scales another, and so on for each field, every plane's rows padded to a multiple of
16 bytes: a lane reads a block's values as one 16-byte word and the scales ride along in
runs of their own. The repack is made once, at load, on the device (pure torch), and the
file's bytes are dropped afterwards: the planes hold the same bytes but for Q4_K's and
Q5_K's 12 bytes of 6-bit sub-block scales and mins, spread to one byte each (4 more
bytes per 256 values: +2.8%), which the kernels would otherwise unpick per block.

The planes, per type (K values in a row; N rows; every plane [N, ...]):

    Q8_0  values int8 [K]       scales fp16 [K/32]
    Q4_0  values u8 [K/2]       scales fp16 [K/32]                 (byte j of a block's
    Q4_1  values u8 [K/2]       scales, mins fp16 [K/32]            16: value j low,
    Q5_0  values u8 [K/2]       scales fp16 [K/32], highs i32 [K/32]  j + 16 high)
    Q5_1  values u8 [K/2]       scales, mins fp16 [K/32], highs i32 [K/32]
    Q4_K  values u8 [K/2]       d, dmin fp16 [K/256], scales, mins u8 [K/32] (6 bits)
    Q5_K  as Q4_K, and highs u8 [K/8]
    Q6_K  values u8 [K/2]       highs u8 [K/4], scales int8 [K/16], d fp16 [K/256]

Values and highs keep the file's order within a block (a block's are a contiguous run
of its plane), so that ``unpack_planes(pack_planes(w))`` gives back the file's bytes
exactly; kernels/linear_planes_triton.py decodes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hetero_infer.kernels.quantized import QuantizedWeight

# Bytes a plane's row is padded to: a 16-byte load's alignment.
ALIGN = 16
# (plane, first byte in the block, bytes, dtype) per type, in the block's order. The
# K-quants' 12 packed bytes of sub-block scales and mins are the one field that is not
# a plain run of bytes ("packed": spread into ``scales`` and ``mins``).
FIELDS: dict[str, tuple[tuple[str, int, int, torch.dtype], ...]] = {
    "Q8_0": (("scales", 0, 2, torch.float16), ("values", 2, 32, torch.int8)),
    "Q4_0": (("scales", 0, 2, torch.float16), ("values", 2, 16, torch.uint8)),
    "Q4_1": (
        ("scales", 0, 2, torch.float16),
        ("mins", 2, 2, torch.float16),
        ("values", 4, 16, torch.uint8),
    ),
    "Q5_0": (
        ("scales", 0, 2, torch.float16),
        ("highs", 2, 4, torch.int32),
        ("values", 6, 16, torch.uint8),
    ),
    "Q5_1": (
        ("scales", 0, 2, torch.float16),
        ("mins", 2, 2, torch.float16),
        ("highs", 4, 4, torch.int32),
        ("values", 8, 16, torch.uint8),
    ),
    "Q4_K": (
        ("d", 0, 2, torch.float16),
        ("dmin", 2, 2, torch.float16),
        ("packed", 4, 12, torch.uint8),
        ("values", 16, 128, torch.uint8),
    ),
    "Q5_K": (
        ("d", 0, 2, torch.float16),
        ("dmin", 2, 2, torch.float16),
        ("packed", 4, 12, torch.uint8),
        ("highs", 16, 32, torch.uint8),
        ("values", 48, 128, torch.uint8),
    ),
    "Q6_K": (
        ("values", 0, 128, torch.uint8),
        ("highs", 128, 64, torch.uint8),
        ("scales", 192, 16, torch.int8),
        ("d", 208, 2, torch.float16),
    ),
}
PLANE_TYPES = tuple(FIELDS)
# Values per block, by type.
BLOCK_VALUES = {qtype: 256 if qtype.endswith("_K") else 32 for qtype in PLANE_TYPES}


@dataclass(frozen=True)
class PlanarWeight:
    """A GGUF weight [out_features, in_features] in planes (the table above): each plane
    [out_features, its row's elements], rows ``stride(0)`` apart (16-byte multiples)."""

    qtype: str
    shape: tuple[int, int]  # (out_features, in_features)
    planes: dict[str, torch.Tensor]
    activation_bits: int = 8  # as QuantizedWeight's (the CPU kernels'; unused here)

    @property
    def device(self) -> torch.device:
        return self.planes["values"].device

    @property
    def nbytes(self) -> int:
        """The bytes the planes take, padding included."""
        return sum(p.untyped_storage().nbytes() for p in self.planes.values())

    def rows(self, index: torch.Tensor | slice) -> PlanarWeight:
        """The weight of some output rows (each plane's rows alike)."""
        planes = {name: _aligned_copy(plane[index]) for name, plane in self.planes.items()}
        out_features = planes["values"].shape[0]
        return PlanarWeight(self.qtype, (out_features, self.shape[1]), planes, self.activation_bits)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[out_features, in_features] in ``dtype``: the file's blocks' reference values."""
        return unpack_planes(self).dequantize(dtype)


def planes_take(weight: QuantizedWeight) -> bool:
    """Whether the planes hold this weight's type (the others keep the file's blocks)."""
    return weight.qtype in PLANE_TYPES and weight.data.dim() == 2 and min(weight.shape) > 0


def pack_planes(weight: QuantizedWeight) -> PlanarWeight:
    """The file's blocks [N, row bytes] -> their planes, on the blocks' device."""
    assert planes_take(weight), (weight.qtype, weight.shape)
    out_features, in_features = weight.shape
    blocks = weight.data.reshape(out_features, in_features // BLOCK_VALUES[weight.qtype], -1)
    planes = {}
    for name, start, size, dtype in FIELDS[weight.qtype]:
        field = blocks[:, :, start : start + size]  # [N, blocks, bytes]
        if name == "packed":
            scales, mins = _spread_scales(field)
            planes["scales"], planes["mins"] = _aligned_copy(scales), _aligned_copy(mins)
            continue
        # Copied as bytes, then viewed: a field's bytes may start at any offset.
        planes[name] = _aligned_copy(field.reshape(out_features, -1)).view(dtype)
    return PlanarWeight(weight.qtype, weight.shape, planes, weight.activation_bits)


def unpack_planes(weight: PlanarWeight) -> QuantizedWeight:
    """The planes -> the file's blocks [N, row bytes], byte for byte."""
    out_features, in_features = weight.shape
    num_blocks = in_features // BLOCK_VALUES[weight.qtype]
    fields = FIELDS[weight.qtype]
    block_bytes = sum(size for _, _, size, _ in fields)
    blocks = torch.empty(
        (out_features, num_blocks, block_bytes), dtype=torch.uint8, device=weight.device
    )
    for name, start, size, _ in fields:
        if name == "packed":
            field = _pack_scales(weight.planes["scales"], weight.planes["mins"], num_blocks)
        else:
            field = weight.planes[name].contiguous().view(torch.uint8)
        blocks[:, :, start : start + size] = field.reshape(out_features, num_blocks, size)
    data = blocks.reshape(out_features, -1)
    return QuantizedWeight(weight.qtype, data, weight.shape, None, weight.activation_bits)


def _aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` [rows, n] whose rows start every 16 bytes (the padding unused)."""
    per_row = ALIGN // t.element_size()
    padded = -(-t.shape[1] // per_row) * per_row
    out = torch.empty((t.shape[0], padded), dtype=t.dtype, device=t.device)[:, : t.shape[1]]
    return out.copy_(t)


def _spread_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A K-quant's 12 bytes per super-block [N, blocks, 12] -> the 8 sub-blocks' 6-bit
    scales and mins, one byte each [N, blocks * 8]. Bytes 0-3 hold scales 0-3 in their
    low 6 bits, bytes 4-7 mins 0-3; scales and mins 4-7 have their low 4 bits in bytes
    8-11 (scale low nibble, min high) and their top 2 in the top bits of bytes 0-3 and
    4-7."""
    first, second, third = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = torch.cat((first & 63, (third & 15) | ((first >> 6) << 4)), dim=-1)
    mins = torch.cat((second & 63, (third >> 4) | ((second >> 6) << 4)), dim=-1)
    rows = packed.shape[0]
    return scales.reshape(rows, -1), mins.reshape(rows, -1)


def _pack_scales(scales: torch.Tensor, mins: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """_spread_scales undone: [N, blocks * 8] twice -> [N, blocks, 12]. Every one of the
    12 bytes' 96 bits holds one of the 16 six-bit fields, so this is exact."""
    scales = scales.reshape(scales.shape[0], num_blocks, 8)
    mins = mins.reshape(mins.shape[0], num_blocks, 8)
    first = (scales[..., :4] & 63) | ((scales[..., 4:] >> 4) << 6)
    second = (mins[..., :4] & 63) | ((mins[..., 4:] >> 4) << 6)
    third = (scales[..., 4:] & 15) | ((mins[..., 4:] & 15) << 4)
    return torch.cat((first, second, third), dim=-1)
