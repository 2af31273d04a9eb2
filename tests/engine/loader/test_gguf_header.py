"""engine/loader/gguf_header.py: a GGUF file's fields and tensors as gguf-py's own
reader reads them, and its ``general.file_type`` read from the file's head past fields
of every kind."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from hetero_infer.engine.loader import resolve_model
from hetero_infer.engine.loader.gguf_header import gguf_file_type, read_gguf_header

Q8_0 = gguf.GGMLQuantizationType.Q8_0
BLOCK_TYPES = [gguf.GGMLQuantizationType[name] for name in ("Q4_1", "Q5_0", "Q4_K", "Q6_K")]


def write_gguf(path: Path, file_type: int | None) -> Path:
    """A GGUF file with fields of each kind before its file type (strings, arrays of
    strings and of numbers, scalars), a tensor of floats and ones of blocks (Q8_0 and
    BLOCK_TYPES)."""
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
    writer.add_tensor(
        "token_embd.weight", gguf.np.arange(128, dtype=gguf.np.float32).reshape(4, 32)
    )
    blocks = gguf.quants.quantize(gguf.np.linspace(-1, 1, 2 * 64, dtype=gguf.np.float32), Q8_0)
    writer.add_tensor("blk.0.ffn_down.weight", blocks.reshape(2, -1), raw_dtype=Q8_0)
    # The other block types of the packaged files (SmolLM2's Q4_1, Gemma 3's Q4_K_M), as
    # random bytes: two rows of 256 values each.
    for i, qtype in enumerate(BLOCK_TYPES):
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        rows = gguf.np.random.default_rng(i).integers(0, 256, (2, 256 // block_size * type_size))
        writer.add_tensor(f"blk.0.part_{i}.weight", rows.astype(gguf.np.uint8), raw_dtype=qtype)
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


def assert_reads_as_gguf_py_does(path: Path) -> None:
    ours, theirs = read_gguf_header(path), gguf.GGUFReader(path)
    keys = [key for key in theirs.fields if not key.startswith("GGUF.")]
    assert list(ours.fields) == keys
    for key in keys:
        assert ours.fields[key] == theirs.fields[key].contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.tensor_type == reference.tensor_type, mine.name
        assert mine.shape == tuple(int(d) for d in reference.shape), mine.name
        assert mine.data.dtype == reference.data.dtype, mine.name
        assert gguf.np.array_equal(mine.data, reference.data), mine.name


def test_fields_and_tensors_of_every_kind(tmp_path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", 3)
    assert_reads_as_gguf_py_does(path)
    header = read_gguf_header(path)
    assert header.fields["tokenizer.ggml.tokens"] == ["<s>", "é", "a" * 300]
    assert header.tensors[1].data.shape == (2, 68)  # Q8_0: 2 blocks of 34 bytes a row


@pytest.mark.slow
def test_the_embedded_file_reads_as_gguf_py_reads_it() -> None:
    """SmolLM2's Q4_1 file. Gemma 3's Q4_K_M file would add only length (262,144 tokens,
    ~20 s in gguf-py's reader): its block types are the tiny file's, and the engine
    reads it to transformers' tokens (tests/engine/test_gemma3_270m.py)."""
    assert_reads_as_gguf_py_does(resolve_model(None).path)


def test_not_a_gguf_file_is_refused(tmp_path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf_header(path)
