"""engine/loader/gguf_bulk_reader.py: gguf-py's reader with array fields read in bulk
builds the very fields gguf-py's own reader does (parts, data indices, types), and
transformers takes it within ``bulk_gguf_reader``."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from hetero_infer.engine.loader import resolve_model
from hetero_infer.engine.loader.gguf_bulk_reader import BulkGGUFReader, bulk_gguf_reader
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from tests.engine.loader.test_gguf_header import write_gguf

NUMBERS = {
    gguf.GGUFValueType.INT8: [-1, 2],
    gguf.GGUFValueType.UINT16: [65535],
    gguf.GGUFValueType.UINT32: [7, 8, 9],
    gguf.GGUFValueType.INT64: [-(2**40)],
    gguf.GGUFValueType.FLOAT32: [0.5],
    gguf.GGUFValueType.FLOAT64: [0.25, -3.0],
}


def assert_same_fields(path: Path) -> None:
    ours, theirs = BulkGGUFReader(path), gguf.GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        mine = ours.fields[key]
        assert (mine.offset, mine.name, mine.data, mine.types) == (
            field.offset,
            field.name,
            field.data,
            field.types,
        ), key
        assert len(mine.parts) == len(field.parts), key
        for part, reference in zip(mine.parts, field.parts, strict=True):
            assert part.dtype == reference.dtype and part.shape == reference.shape, key
            assert part.tobytes() == reference.tobytes(), key
    assert ours.data_offset == theirs.data_offset
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]


def test_fields_of_every_kind(tmp_path) -> None:
    """Arrays of strings (one empty), of numbers of each size, of bools, and an array of
    arrays (gguf-py's own reading), beside write_gguf's fields. (gguf-py writes no
    empty array.)"""
    writer = gguf.GGUFWriter(tmp_path / "arrays.gguf", "llama")
    writer.add_array("test.strings", ["", "é", "a" * 300])
    for value_type, values in NUMBERS.items():
        key = f"test.{value_type.name.lower()}"
        writer.add_key_value(key, values, gguf.GGUFValueType.ARRAY, sub_type=value_type)
    writer.add_array("test.bools", [True, False, True])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_string("test.after", "read past the arrays")
    writer.add_tensor("token_embd.weight", gguf.np.ones((2, 32), dtype=gguf.np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_same_fields(tmp_path / "arrays.gguf")
    assert_same_fields(write_gguf(tmp_path / "tiny.gguf", 3))


@pytest.mark.slow
def test_the_embedded_file() -> None:
    """SmolLM2's: 49,152 tokens and 48,900 merges."""
    assert_same_fields(resolve_model(None).path)


def test_transformers_reads_through_it_within_the_block(tmp_path, monkeypatch) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", 3)
    arrays_read = []
    read = BulkGGUFReader._get_field_parts

    def counted(self, offset: int, raw_type: int):
        arrays_read.append(raw_type == gguf.GGUFValueType.ARRAY)
        return read(self, offset, raw_type)

    monkeypatch.setattr(BulkGGUFReader, "_get_field_parts", counted)
    stock = gguf.GGUFReader
    with bulk_gguf_reader():
        parsed = load_gguf_checkpoint(str(path))
    assert gguf.GGUFReader is stock and any(arrays_read)
    assert parsed == load_gguf_checkpoint(str(path))  # gguf-py's own reading
    assert parsed["tokenizer"]["tokens"] == ["<s>", "é", "a" * 300]
