"""gguf-py's GGUFReader with its array fields read in bulk, for transformers.

transformers reads a GGUF file's metadata through gguf-py's GGUFReader: to convert its
config and tokenizer (engine/loader/gguf_metadata.py), and again when it loads the
file's weights (the tests' reference). That reader makes every element of an array
field numpy views of a memory map, a few microseconds each: 17 s for Gemma 3's file,
whose vocabulary is three arrays of 262,144 values, 4 s for SmolLM2's. BulkGGUFReader
builds the same fields (the parts, data indices and types gguf-py's ReaderField holds)
from views of one plain array over the file, ~20 times faster; ``bulk_gguf_reader``
has transformers take it.
"""

from __future__ import annotations

import contextlib
import struct
import threading
from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np

_LENGTH = struct.Struct("<Q")
_SWAP_LOCK = threading.RLock()  # a block within a block (same thread) nests


class BulkGGUFReader(gguf.GGUFReader):
    """GGUFReader whose arrays of strings and of numbers are read in bulk; other fields,
    the tensors, and files in the other byte order are gguf-py's own reading."""

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list, list, list]:
        if raw_type != gguf.GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_item_type, count = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        item_type = gguf.GGUFValueType(int(raw_item_type[0]))
        scalar = self.gguf_scalar_to_np.get(item_type)
        if item_type != gguf.GGUFValueType.STRING and scalar is None:  # arrays of arrays
            return super()._get_field_parts(orig_offs, raw_type)
        parts: list[np.ndarray] = [raw_item_type, count]
        types = [gguf.GGUFValueType.ARRAY] + ([item_type] if count[0] else [])
        file = np.asarray(self.data)  # a plain array's views skip memmap's set-up
        start = orig_offs + 12
        if scalar is None:  # each string: its length, then its bytes
            buffer, end = memoryview(file), start
            for _ in range(int(count[0])):
                (length,) = _LENGTH.unpack_from(buffer, end)
                parts += [file[end : end + 8].view(np.uint64), file[end + 8 : end + 8 + length]]
                end += 8 + length
            data = list(range(3, len(parts), 2))
        else:
            end = start + int(count[0]) * np.dtype(scalar).itemsize
            parts += list(file[start:end].view(scalar).reshape(-1, 1))
            data = list(range(2, len(parts)))
        return end - orig_offs, parts, data, types


@contextlib.contextmanager
def bulk_gguf_reader() -> Iterator[None]:
    """Within this block gguf-py's GGUFReader is BulkGGUFReader (transformers imports it
    from gguf-py when it reads a file)."""
    with _SWAP_LOCK:
        reader: Any = gguf.GGUFReader
        gguf.GGUFReader = BulkGGUFReader
        try:
            yield
        finally:
            gguf.GGUFReader = reader
