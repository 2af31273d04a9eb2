"""engine/loader/gguf_header.py: a GGUF file's ``general.file_type``, read from the
file's head past fields of every kind, as gguf-py's full reader reads it."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from hetero_infer.engine.loader import resolve_model
from hetero_infer.engine.loader.gguf_header import gguf_file_type


def write_gguf(path: Path, file_type: int | None) -> Path:
    """A GGUF file with fields of each kind before its file type (strings, arrays of
    strings and of numbers, scalars) and one small tensor."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_string("general.name", "tiny")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "é", "a" * 300])
    writer.add_array("tokenizer.ggml.scores", [0.0, -1.5, 2.0])
    writer.add_uint64("general.size", 7)
    writer.add_bool("general.flag", True)
    writer.add_float64("general.ratio", 0.5)
    if file_type is not None:
        writer.add_file_type(file_type)
    writer.add_uint32("llama.block_count", 1)
    writer.add_tensor("token_embd.weight", gguf.np.zeros((4, 32), dtype=gguf.np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("file_type", "name"),
    [(15, "Q4_K_M"), (3, "Q4_1"), (1, "F16"), (0, "ALL_F32"), (999, None), (None, None)],
)
def test_the_file_type_is_read_past_every_kind_of_field(tmp_path, file_type, name) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", file_type)
    assert gguf_file_type(path) == name
    if file_type is not None:  # what gguf-py's reader finds there
        assert gguf.GGUFReader(path).fields["general.file_type"].contents() == file_type


def test_the_embedded_model_is_q4_1() -> None:
    assert gguf_file_type(resolve_model(None).path) == "Q4_1"


def test_not_a_gguf_file(tmp_path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    assert gguf_file_type(path) is None
