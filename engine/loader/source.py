"""Where a model comes from: a safetensors folder (local or hub), a GGUF file, a model
shipped as a PyPI package by its short name (packaged.py), or, when no model is named,
the small chat model among those."""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass
from pathlib import Path

from hetero_infer.engine.loader.packaged import (
    DEFAULT_MODEL,
    PACKAGED_MODELS,
    packaged_model_path,
)
from hetero_infer.engine.settings.exceptions import ConfigError, ModelNotFoundError

logger = logging.getLogger(__name__)

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

    def weight_bytes(self) -> int:
        """The size of the weights' files: the least memory the loaded model takes."""
        if self.is_gguf:
            return self.path.stat().st_size
        return sum(p.stat().st_size for p in self.folder.glob("*.safetensors"))


def default_model_path() -> Path:
    """The GGUF file of the model used when none is named (SmolLM2-135M-Instruct)."""
    return packaged_model_path(DEFAULT_MODEL)


def resolve_model(model: str | None) -> ModelSource:
    """Turn what the user wrote (None, a folder, a .gguf file, a packaged model's name,
    or a hub id) into a source."""
    if model is None or model in PACKAGED_MODELS:
        path = packaged_model_path(model or DEFAULT_MODEL)
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
            f"model {model!r}: not a local folder or .gguf file{_packaged_hint(model)}, "
            f"and the hub download failed: {type(e).__name__}: {e}"
        ) from e
    folder = Path(folder)
    if not any(folder.glob("*.safetensors")) or not (folder / "config.json").is_file():
        raise ConfigError(
            f"model {model!r}: the hub repo has no config.json with *.safetensors weights "
            "(only safetensors repos are loaded from the hub; pass a local .gguf file instead)"
        )
    logger.info("model %s downloaded to %s", model, folder)
    return ModelSource(path=folder)


def _packaged_hint(model: str) -> str:
    """A packaged model's name the user may have meant (``gemma-3-270M``), as a hint."""
    close = difflib.get_close_matches(model.lower(), PACKAGED_MODELS, n=1, cutoff=0.8)
    packaged = ", ".join(PACKAGED_MODELS)
    return f" (did you mean {close[0]!r}? the packaged models: {packaged})" if close else ""


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
