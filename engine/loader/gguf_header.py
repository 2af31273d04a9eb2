"""A GGUF file's header: its key-value fields, and its tensors' names, types, shapes
and data (views of a read-only memory map).

gguf-py's GGUFReader makes a numpy view of every element of every array field: 15 s
on Gemma 3's file, whose vocabulary alone is three arrays of 262,144 values, each time
the file loads. Here a numeric array is one view and a string one Python slice, so
the whole header reads in well under a second. ``gguf_file_type`` (asked before the
weights load: engine/setup.py, a dtype that keeps the blocks) stops at its key, which
llama.cpp writes among the first.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

# GGUF's fixed-size value types (GGUFValueType), little-endian, by their type codes.
_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRUCTS = {fmt: struct.Struct(fmt) for fmt in _FORMATS.values()}
_STRING, _ARRAY = 8, 9
_FILE_TYPE_KEY = "general.file_type"
# Tensor types stored as plain numbers; every other type is blocks of bytes.
_PLAIN_TYPES = {
    gguf.GGMLQuantizationType.F32: np.float32,
    gguf.GGMLQuantizationType.F16: np.float16,
    gguf.GGMLQuantizationType.F64: np.float64,
    gguf.GGMLQuantizationType.I8: np.int8,
    gguf.GGMLQuantizationType.I16: np.int16,
    gguf.GGMLQuantizationType.I32: np.int32,
    gguf.GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor as gguf-py's reader gives it: ``shape`` fastest dimension first;
    ``data`` [slowest .. fastest] of its numbers, or for a quantized type
    [slowest .. rows, bytes per row] of its blocks' bytes."""

    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass(frozen=True)
class GGUFHeader:
    """``fields``: each key's value (a number, bool or str, or a list of them: what
    gguf-py's ``ReaderField.contents()`` returns); ``tensors`` in the file's order."""

    fields: dict[str, Any]
    tensors: list[GGUFTensor]


class _Cursor:
    """Reads GGUF's little-endian values from a mapped file, front to back, through a
    memoryview: a slice of the memory map costs microseconds (numpy sets up each view),
    a memoryview's a tenth of one. Over Gemma 3's vocabulary that was 0.7 s a load."""

    def __init__(self, data: np.ndarray) -> None:
        self.data, self.buffer, self.offset = data, memoryview(data), 0

    def number(self, fmt: str) -> Any:
        unpack = _STRUCTS[fmt]
        (value,) = unpack.unpack_from(self.buffer, self.offset)
        self.offset += unpack.size
        return value

    def string(self) -> str:
        length = self.number("<Q")
        start, self.offset = self.offset, self.offset + length
        return str(self.buffer[start : self.offset], "utf-8", "replace")

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type != _ARRAY:
            return self.number(_FORMATS[value_type])
        element_type, count = self.number("<I"), self.number("<Q")
        if element_type not in _FORMATS:  # strings, or arrays of arrays
            return [self.value(element_type) for _ in range(count)]
        dtype = np.dtype(_FORMATS[element_type])
        start, self.offset = self.offset, self.offset + count * dtype.itemsize
        return np.frombuffer(self.buffer, dtype, count, start).tolist()


def _open(path: Path | str) -> tuple[_Cursor, int, int] | None:
    """A cursor on the file mapped read-only, past the fixed part of a GGUF header
    (version 2 or later, little-endian), with the tensor and field counts; None for
    another file."""
    if Path(path).stat().st_size < 24:  # an empty file cannot be mapped
        return None
    data = np.memmap(path, mode="r")
    if bytes(data[:4]) != b"GGUF":
        return None
    cursor = _Cursor(data)
    cursor.offset = 4
    if cursor.number("<I") < 2:
        return None
    return cursor, cursor.number("<Q"), cursor.number("<Q")


def read_gguf_header(path: Path | str) -> GGUFHeader:
    """Every field and tensor of the GGUF file at ``path``."""
    opened = _open(path)
    if opened is None:
        raise ValueError(f"{path}: not a GGUF file (version 2 or later, little-endian)")
    cursor, tensor_count, field_count = opened
    data = cursor.data
    fields: dict[str, Any] = {}
    for _ in range(field_count):
        key = cursor.string()
        fields[key] = cursor.value(cursor.number("<I"))
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = [cursor.number("<Q") for _ in range(cursor.number("<I"))]
        infos.append((name, dims, cursor.number("<I"), cursor.number("<Q")))
    alignment = fields.get("general.alignment", 32)
    start = -(-cursor.offset // alignment) * alignment
    tensors = []
    for name, dims, raw_type, offset in infos:
        tensor_type = gguf.GGMLQuantizationType(raw_type)
        block_size, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
        nbytes = int(np.prod(dims)) * block_bytes // block_size
        shape = tuple(reversed(dims))
        item = _PLAIN_TYPES.get(tensor_type, np.uint8)
        if item is np.uint8:
            shape = gguf.quant_shape_to_byte_shape(shape, tensor_type)
        view = data[start + offset : start + offset + nbytes].view(item).reshape(shape)
        tensors.append(GGUFTensor(name, tensor_type, tuple(dims), view))
    return GGUFHeader(fields, tensors)


def gguf_file_type(path: Path) -> str | None:
    """The file's ``general.file_type`` as llama.cpp names it without its ``MOSTLY_``
    ("Q4_K_M", "Q8_0", "F16", "ALL_F32"), or None where the file has none (or is not a
    GGUF of version 2 or later)."""
    opened = _open(path)
    if opened is None:
        return None
    cursor, _tensor_count, field_count = opened
    for _ in range(field_count):
        key, value_type = cursor.string(), cursor.number("<I")
        if key == _FILE_TYPE_KEY and value_type in (4, 5):  # uint32 or int32
            try:
                return gguf.LlamaFileType(cursor.value(value_type)).name.removeprefix("MOSTLY_")
            except ValueError:
                return None
        cursor.value(value_type)  # read past it
    return None
