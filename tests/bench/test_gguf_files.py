"""The benchmark GGUFs (bench/gguf_files.py) on a tiny Qwen2 folder in the benchmark's
byte-level tokenizer: the Qwen2 writer's file read back by our GGUF loader as the
folder's tensors (exactly in F32; through the same blocks in Q8_0 and Q4_1), its
config and tokenizer as the folder's; a rewrite in another type keeping names, shapes
and metadata; bench.peers and bench.single_stream pointing llama.cpp and ours at the
same file. Where bench/setup_llama_server.sh has built it, llama-bench runs the file.

OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/bench/test_gguf_files.py
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from hetero_infer.engine.loader.gguf import load_gguf
from hetero_infer.kernels.quantized import QuantizedWeight
from safetensors.torch import load_file

from bench import gguf_files, llama_bench, models, peers, single_stream

QType = gguf.GGMLQuantizationType
VOCAB = 320  # the 256 bytes, fillers, and the tokenizer's eos (its last token)
BOS = 300


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 (rows of 32-multiples, as the block types need; 2 KV heads of 4)
    with random biases and norms, so that a misplaced one would show."""
    path = tmp_path_factory.mktemp("tiny-qwen2")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=50000.0,
        tie_word_embeddings=True,
        bos_token_id=BOS,
        eos_token_id=BOS,
    )
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                param.normal_(0, 0.5)
    model.save_pretrained(path)
    models.byte_level_tokenizer(VOCAB).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def written(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf")
    return {
        target: gguf_files.qwen2_gguf(folder, target, out / f"tiny.{target}.gguf")
        for target in ("f32", "q8_0", "q4_1")
    }


def _fields(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


# ---- the Qwen2 writer ----


def test_f32_gguf_reads_back_as_the_folder(folder: Path, written: dict[str, Path]) -> None:
    expected = load_file(folder / "model.safetensors")
    expected.pop("lm_head.weight", None)  # tied: the file has token_embd only
    state_dict = load_gguf(written["f32"], torch.float32)
    assert state_dict.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state_dict[name], tensor), name  # q/k rows not permuted


@pytest.mark.parametrize("target", ["q8_0", "q4_1"])
def test_quantized_gguf_keeps_the_folder_in_blocks(
    folder: Path, written: dict[str, Path], target: str
) -> None:
    reader = gguf.GGUFReader(written[target])
    types = {t.name: t.tensor_type for t in reader.tensors}
    weight_type = gguf_files.GGUF_TYPES[target][0]
    assert types["token_embd.weight"] == QType.Q8_0  # in a Q4_1 file too
    assert types["blk.1.ffn_down.weight"] == weight_type
    assert types["blk.0.attn_k.weight"] == weight_type
    assert types["blk.0.attn_q.bias"] == types["blk.0.attn_norm.weight"] == QType.F32
    assert "output.weight" not in types

    expected = load_file(folder / "model.safetensors")
    kept = load_gguf(written[target], torch.float32, keep_quantized=True)
    for name, tensor in expected.items():
        if name == "lm_head.weight":
            continue
        if tensor.ndim == 1:  # norms and biases: F32, exact
            assert torch.equal(kept[name], tensor), name
            continue
        weight = kept[name]
        assert isinstance(weight, QuantizedWeight), name
        qtype = QType[weight.qtype]
        blocks = gguf.quants.quantize(tensor.numpy(), qtype)
        assert np.array_equal(weight.data.numpy(), blocks), name  # as gguf-py encodes it


def test_metadata_is_what_llama_cpp_reads(written: dict[str, Path]) -> None:
    fields = _fields(written["q4_1"])
    assert fields["general.architecture"] == "qwen2"
    assert fields["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_1
    assert fields["qwen2.block_count"] == 2
    assert fields["qwen2.embedding_length"] == 64
    assert fields["qwen2.feed_forward_length"] == 96
    assert fields["qwen2.attention.head_count"] == 4
    assert fields["qwen2.attention.head_count_kv"] == 2
    assert fields["qwen2.context_length"] == 256
    assert fields["qwen2.rope.freq_base"] == pytest.approx(50000.0)
    assert fields["qwen2.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.pre"] == "qwen2"
    assert len(fields["tokenizer.ggml.tokens"]) == VOCAB
    assert fields["tokenizer.ggml.merges"] == []  # present, as llama.cpp requires
    # bos from the config, eos the tokenizer's own (its last token, a control one)
    assert fields["tokenizer.ggml.bos_token_id"] == BOS
    assert fields["tokenizer.ggml.eos_token_id"] == VOCAB - 1
    assert fields["tokenizer.ggml.token_type"][VOCAB - 1] == gguf.TokenType.CONTROL
    assert fields["tokenizer.ggml.token_type"][0] == gguf.TokenType.NORMAL
    assert fields["tokenizer.ggml.add_bos_token"] is False  # the folder adds none
    assert "messages" in fields["tokenizer.chat_template"]


def test_config_and_tokenizer_convert_back_as_the_folders(
    folder: Path, written: dict[str, Path]
) -> None:
    path = written["q8_0"]
    config = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    assert (config.model_type, config.vocab_size) == ("qwen2", VOCAB)
    assert config.tie_word_embeddings and config.num_key_value_heads == 2
    ours = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    text = "Hello, world! 123 héllo\n\t☃"
    assert ours.encode(text) == theirs.encode(text)
    assert ours.decode(ours.encode(text)) == text


def test_a_written_file_is_reused(folder: Path, written: dict[str, Path]) -> None:
    mtime = written["q8_0"].stat().st_mtime_ns
    assert gguf_files.qwen2_gguf(folder, "q8_0", written["q8_0"]) == written["q8_0"]
    assert written["q8_0"].stat().st_mtime_ns == mtime
    assert not list(written["q8_0"].parent.glob("*.partial"))


# ---- a rewrite in another type ----


@pytest.mark.parametrize("target", gguf_files.REWRITE_TYPES)
def test_rewrite_keeps_names_shapes_and_metadata(
    written: dict[str, Path], tmp_path: Path, target: str
) -> None:
    # The Q4_1 file with its Q8_0 embedding: the layout of the embedded SmolLM2 file.
    source = written["q4_1"]
    out = gguf_files.rewritten_gguf(source, target, tmp_path / f"x.{target}.gguf")
    before, after = gguf.GGUFReader(source), gguf.GGUFReader(out)
    assert [t.name for t in after.tensors] == [t.name for t in before.tensors]
    qtype, file_type = gguf_files.GGUF_TYPES[target]
    for old, new in zip(before.tensors, after.tensors, strict=True):
        assert list(new.shape) == list(old.shape), old.name
        kept = old.tensor_type in gguf_files.kept_types(target)
        assert new.tensor_type == (old.tensor_type if kept else qtype), old.name
        was = gguf.quants.dequantize(old.data, old.tensor_type)
        now = gguf.quants.dequantize(new.data, new.tensor_type)
        if kept:
            assert np.array_equal(now, was), old.name
        else:  # the values the old blocks stand for, in the new type's precision: Q4_0
            # steps by 1/8 of a block's largest magnitude and clips the other sign's
            # largest by one step; 8 bits step by 1/127
            step = 0.13 if target == "q4_0" else 0.02
            assert np.allclose(now, was, rtol=1e-2, atol=step * np.abs(was).max()), old.name
    fields_before, fields_after = _fields(source), _fields(out)
    assert fields_after.pop("general.file_type") == file_type
    fields_before.pop("general.file_type")
    assert fields_after == fields_before  # the empty merges array included


# ---- the benchmarks point llama.cpp and ours at the same file ----


def test_single_stream_serves_ours_the_qwen_gguf_llama_server_gets(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peers, "model_folder", lambda name: folder)
    monkeypatch.setattr(gguf_files, "cache_root", lambda: tmp_path)
    args = single_stream.build_parser().parse_args(
        ["--model", "qwen2.5-0.5b-shape", "--gguf-dtype", "q8_0", "--ours-flags", "--dtype float32"]
    )
    path, note = peers.llama_gguf(args.model, args.gguf_dtype)
    assert path == tmp_path / f"{folder.name}.Q8_0.gguf" and path.is_file()
    assert "Q8_0" in note
    assert single_stream.ours_flags(args, path) == f"--model {path} --dtype float32"
    assert peers.llama_gguf(args.model, "q4_1")[1].endswith(
        "linear weights in Q4_1, the tied embedding in Q8_0: not the others' weights"
    )
    with pytest.raises(peers.Skip):
        peers.llama_gguf("not-a-model", "q8_0")


def test_q8_0_is_a_gguf_dtype_of_both_benchmarks() -> None:
    assert peers.build_parser().parse_args(["--gguf-dtype", "q8_0"]).gguf_dtype == "q8_0"
    args = single_stream.build_parser().parse_args(["--gguf-dtype", "q8_0"])
    assert (args.model, args.gguf_dtype) == ("smollm2", "q8_0")


# ---- llama.cpp loads it, where it is built ----

LLAMA_BENCH = peers.LLAMA_SERVER_BIN / "llama-bench"


@pytest.mark.skipif(
    not os.access(LLAMA_BENCH, os.X_OK), reason="llama-bench not built (setup_llama_server.sh)"
)
@pytest.mark.parametrize("target", ["q4_1", "q8_0"])
def test_llama_bench_runs_the_qwen2_gguf(written: dict[str, Path], target: str) -> None:
    command = [str(LLAMA_BENCH), "-m", str(written[target]), "-t", "1", "-p", "8", "-n", "8"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tg8" in llama_bench.parse(proc.stdout)
