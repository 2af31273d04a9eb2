"""What a GGUF file says it is quantized as (``general.file_type``), read from the head
of the file.

gguf-py's GGUFReader parses every field and tensor of a file before answering: 15 s on
Gemma 3's file, whose vocabulary alone is 262,144 strings. The engine's setup asks only
for the file type, before the weights load (engine/setup.py: a dtype that keeps the
blocks), and llama.cpp writes the ``general.*`` fields first, so this reads the
key-value section in order and stops at that key.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

import gguf

# Sizes of GGUF's fixed-size value types, by their type codes (GGUFValueType).
_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_FILE_TYPE_KEY = "general.file_type"


def gguf_file_type(path: Path) -> str | None:
    """The file's ``general.file_type`` as llama.cpp names it without its ``MOSTLY_``
    ("Q4_K_M", "Q8_0", "F16", "ALL_F32"), or None where the file has none (or is not a
    GGUF of version 2 or later)."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF" or _read(f, "<I") < 2:
            return None
        _tensor_count, kv_count = _read(f, "<Q"), _read(f, "<Q")
        for _ in range(kv_count):
            key = _read_string(f)
            value_type = _read(f, "<I")
            if key == _FILE_TYPE_KEY and value_type in (4, 5):  # uint32 or int32
                value = _read(f, "<I" if value_type == 4 else "<i")
                try:
                    return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_")
                except ValueError:
                    return None
            _skip_value(f, value_type)
    return None


def _read(f: BinaryIO, fmt: str) -> int:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise EOFError("GGUF header ends early")
    return struct.unpack(fmt, data)[0]


def _read_string(f: BinaryIO) -> str:
    return f.read(_read(f, "<Q")).decode("utf-8", errors="replace")


def _skip_value(f: BinaryIO, value_type: int) -> None:
    if value_type == _STRING:
        f.seek(_read(f, "<Q"), 1)
    elif value_type == _ARRAY:
        element_type, count = _read(f, "<I"), _read(f, "<Q")
        if element_type in _FIXED_SIZES:
            f.seek(_FIXED_SIZES[element_type] * count, 1)
        else:
            for _ in range(count):
                _skip_value(f, element_type)
    else:
        f.seek(_FIXED_SIZES[value_type], 1)
