"""engine/loader/gguf_metadata.py: a GGUF file's metadata is converted once, also when
processes ask for it at once (the others wait and take the first one's files), and
the conversion reads the file once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import gguf
import numpy as np
import transformers
import transformers.modeling_gguf_pytorch_utils as transformers_gguf
from hetero_infer.engine.loader import gguf_metadata
from hetero_infer.engine.loader.source import ModelSource


def test_callers_at_once_convert_the_file_once(tmp_path, monkeypatch) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(gguf_metadata, "GGUF_METADATA_CACHE", tmp_path / "cache")
    conversions = []

    def slow_conversion(source: ModelSource, folder: Path) -> Path:
        conversions.append(source)
        time.sleep(0.2)  # long enough for every caller to ask before it ends
        folder.mkdir(parents=True)
        for name in ("config.json", "tokenizer_config.json"):
            (folder / name).write_text("{}")
        return folder

    monkeypatch.setattr(gguf_metadata, "_convert_metadata", slow_conversion)
    source = ModelSource(path=model, gguf_file=model.name)
    folders = []
    callers = [
        threading.Thread(target=lambda: folders.append(gguf_metadata.gguf_metadata_folder(source)))
        for _ in range(3)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert len(conversions) == 1
    assert len(set(folders)) == 1 and (folders[0] / "config.json").is_file()
    assert gguf_metadata.gguf_metadata_folder(source) == folders[0]
    assert len(conversions) == 1


def write_tiny_gguf(path: Path) -> None:
    """A GGUF file with a tiny Llama's config fields, a byte-pair tokenizer of a few
    tokens and its embedding."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(4)
    tokens = ["<s>", "</s>", "a", "b", "c", "ab", "abc", "Ġ"]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3] + [1] * (len(tokens) - 2))  # 3: control
    writer.add_token_merges(["a b", "ab c"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_conversion_reads_the_file_once(tmp_path, monkeypatch) -> None:
    """transformers reads the whole file for the config and again for the tokenizer
    (~0.7 s each for SmolLM2's, 2.6 for Gemma 3's): the second takes the first one's
    result, and the files are what transformers' own two reads give."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    monkeypatch.setattr(gguf_metadata, "GGUF_METADATA_CACHE", tmp_path / "cache")
    reads = []
    load = transformers_gguf.load_gguf_checkpoint

    def counted(gguf_path, return_tensors=False, **kwargs):
        reads.append(gguf_path)
        return load(gguf_path, return_tensors, **kwargs)

    monkeypatch.setattr(transformers_gguf, "load_gguf_checkpoint", counted)
    folder = gguf_metadata.gguf_metadata_folder(ModelSource(path=path, gguf_file=path.name))
    assert len(reads) == 1
    assert transformers_gguf.load_gguf_checkpoint is counted  # put back
    config = transformers.AutoConfig.from_pretrained(tmp_path, gguf_file=path.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert len(reads) == 3
    converted = transformers.AutoConfig.from_pretrained(folder).to_dict()
    assert {**converted, "_name_or_path": ""} == {**config.to_dict(), "_name_or_path": ""}
    converted_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert converted_tokenizer.get_vocab() == tokenizer.get_vocab()
    text = "abcab cba"
    assert converted_tokenizer.encode(text) == tokenizer.encode(text)
    assert tokenizer.encode(text, add_special_tokens=False)[:2] == [6, 5]  # abc, ab
