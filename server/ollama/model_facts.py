"""What Ollama's /api/tags, /api/show and /api/ps say of the served model: its files
(size, modification time, a digest), format, family, parameter count and quantization.

The digest identifies the served files by their path, size and modification time (a
content hash of gigabytes would cost seconds per listing); it changes when they do.
The parameter count comes from the model's shapes, as the loaded layers hold them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from hetero_infer.engine.loader.packaged import PACKAGED_MODELS
from hetero_infer.engine.loader.source import ModelSource, resolve_model
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.settings.config import EngineConfig


@dataclass(frozen=True)
class ModelFacts:
    format: str  # "gguf" or "safetensors"
    family: str
    parameter_count: int
    quantization_level: str
    size: int  # bytes of weights on disk
    modified_at: str
    digest: str

    def details(self) -> dict[str, Any]:
        return {
            "parent_model": "",
            "format": self.format,
            "family": self.family,
            "families": [self.family],
            "parameter_size": parameter_size(self.parameter_count),
            "quantization_level": self.quantization_level,
        }


def model_facts(engine: EngineConfig, model: ModelConfig) -> ModelFacts:
    source = _local_source(engine.model)
    files = _weight_files(source)
    stats = [path.stat() for path in files]
    size = sum(stat.st_size for stat in stats)
    mtime_ns = max((stat.st_mtime_ns for stat in stats), default=0)
    identity = f"{source.path if source else engine.model}:{size}:{mtime_ns}"
    level = _quantization_level(source, engine, str(files[0]) if files else "", mtime_ns)
    return ModelFacts(
        format="gguf" if source is not None and source.is_gguf else "safetensors",
        family=model.model_type,
        parameter_count=parameter_count(model),
        quantization_level=level,
        size=size,
        modified_at=datetime.fromtimestamp(mtime_ns / 1e9, UTC).isoformat(),
        digest=hashlib.sha256(identity.encode()).hexdigest(),
    )


def parameter_count(m: ModelConfig) -> int:
    """Embeddings, each layer's attention, MLP (or experts) and norms, the final norm and
    the head."""
    h, q, kv = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    attention = h * q + 2 * h * kv + q * h
    attention += (q + 2 * kv) * m.qkv_bias + h * m.o_bias
    norms = 2 * h * (2 if m.sandwich_norms else 1)
    if m.qk_norm:
        # One weight per head dim, shared by the heads; OLMoE's spans all of them.
        norms += q + kv if m.qk_norm_across_heads else 2 * m.head_dim
    layers = sum(
        attention + norms + _mlp_size(m, sparse)
        for sparse in (m.moe.sparse_layers if m.moe else (False,) * m.num_layers)
    )
    embedding = m.vocab_size * h
    return embedding * (1 if m.tie_word_embeddings else 2) + layers + h


def _mlp_size(m: ModelConfig, sparse: bool) -> int:
    """A layer's MLP: gate, up and down projections; a sparse layer's router, experts and
    shared expert (with its one-output gate)."""
    h = m.hidden_size
    if not sparse:
        return 3 * h * m.intermediate_size + (2 * m.intermediate_size + h) * m.mlp_bias
    moe = m.moe
    shared = moe.shared_expert_intermediate_size
    experts = moe.num_experts * 3 * h * moe.expert_intermediate_size
    return h * moe.num_experts + experts + (3 * h * shared + h if shared else 0)


def parameter_size(count: int) -> str:
    """As Ollama writes it: "8.0B", "135M"."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}" if unit == "B" else f"{count / scale:.0f}{unit}"
    return str(count)


def _local_source(model: str | None) -> ModelSource | None:
    """The model's files, where they are on this machine (a hub id: None, so that
    listing never downloads)."""
    if model is not None and model not in PACKAGED_MODELS and not Path(model).exists():
        return None
    try:
        return resolve_model(model)
    except (ValueError, OSError):
        return None


def _weight_files(source: ModelSource | None) -> list[Path]:
    if source is None:
        return []
    if source.is_gguf:
        return [source.path]
    return sorted(source.path.glob("*.safetensors"))


def _quantization_level(
    source: ModelSource | None, engine: EngineConfig, first_file: str, mtime_ns: int
) -> str:
    if engine.quantization == "int8":
        return "Q8_0"
    if source is not None and source.is_gguf:
        return _gguf_file_type(first_file, mtime_ns)
    if source is not None and engine.dtype == "auto":
        return _checkpoint_dtype(str(source.path / "config.json"), mtime_ns)
    return {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(engine.dtype, "unknown")


@cache
def _gguf_file_type(path: str, mtime_ns: int) -> str:
    """The GGUF file's type ("Q4_1", "F16"): read once per file version."""
    try:
        from hetero_infer.engine.loader.gguf_header import gguf_file_type

        name = gguf_file_type(Path(path))
    except Exception:  # an unreadable header only costs the listing its level
        return "unknown"
    return "unknown" if name is None else name.removeprefix("ALL_")


@cache
def _checkpoint_dtype(config_path: str, mtime_ns: int) -> str:
    try:
        config = json.loads(Path(config_path).read_text())
    except (OSError, ValueError):
        return "unknown"
    dtype = config.get("torch_dtype") or config.get("dtype") or ""
    return {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(dtype, "unknown")
