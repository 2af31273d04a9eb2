"""Hetero-Paged-Infer's engine: continuous batching over a paged KV cache.

``from engine import LLMEngine, EngineConfig, SamplingParams``. Names load on first
use, so importing one small part (e.g. engine.block_manager) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EngineConfig": "engine.config",
    "LLMEngine": "engine.llm_engine",
    "RequestOutput": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
