"""Hetero-Paged-Infer's engine: continuous batching over a paged KV cache.

``from engine import LLMEngine, EngineConfig, SamplingParams``. Names load on first
use, so importing one small part (e.g. engine.block_manager) stays cheap.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# OpenMP threads that spin while they wait for work collapse when another process
# shares the cores: on 2 busy cores a small matmul took 10x longer with 2 spinning
# threads than with 1, and 2 passive threads were the fastest of all. libgomp reads
# this when torch loads, so it only takes effect where the engine is imported first
# (the CLI and server are); an explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
