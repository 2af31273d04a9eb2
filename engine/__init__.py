"""Hetero-Paged-Infer's engine: continuous batching over a paged KV cache.

``from hetero_infer.engine import LLMEngine, EngineConfig, SamplingParams`` (vLLM's and
mini-infer's API), or ``from hetero_infer.engine import InferenceEngine, GenerationParams``
(the Rust seed's). Names load on first use, so importing one small part (e.g. the
scheduler) stays cheap, and importing sets nothing in the process.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EngineConfig": "hetero_infer.engine.settings.config",
    "LLMEngine": "hetero_infer.engine.entrypoints.llm_engine",
    "RequestOutput": "hetero_infer.engine.entrypoints.outputs",
    "GenerateOutput": "hetero_infer.engine.entrypoints.outputs",
    "SamplingParams": "hetero_infer.engine.params.sampling_params",
    # The Hetero-Paged-Infer seed's API.
    "InferenceEngine": "hetero_infer.engine.entrypoints.inference_engine",
    "GenerationParams": "hetero_infer.engine.entrypoints.inference_engine",
    "CompletedRequest": "hetero_infer.engine.entrypoints.inference_engine",
    "MemoryStats": "hetero_infer.engine.entrypoints.inference_engine",
    # Errors (both seeds' names).
    "EngineError": "hetero_infer.engine.settings.exceptions",
    "ConfigError": "hetero_infer.engine.settings.exceptions",
    "ModelNotFoundError": "hetero_infer.engine.settings.exceptions",
    "ValidationError": "hetero_infer.engine.settings.exceptions",
    "InvalidRequestError": "hetero_infer.engine.settings.exceptions",
    "OutOfMemoryError": "hetero_infer.engine.settings.exceptions",
    "SchedulerError": "hetero_infer.engine.settings.exceptions",
    "ExecutionError": "hetero_infer.engine.settings.exceptions",
    # What an entry point applies to its process (see engine/entrypoints/process_settings.py).
    "set_openmp_wait_policy": "hetero_infer.engine.entrypoints.process_settings",
    "apply_process_settings": "hetero_infer.engine.entrypoints.process_settings",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
