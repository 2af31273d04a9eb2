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
    "EngineConfig": "hetero_infer.engine.config",
    "LLMEngine": "hetero_infer.engine.llm_engine",
    "RequestOutput": "hetero_infer.engine.outputs",
    "GenerateOutput": "hetero_infer.engine.outputs",
    "SamplingParams": "hetero_infer.engine.sampling_params",
    # The Hetero-Paged-Infer seed's API.
    "InferenceEngine": "hetero_infer.engine.inference_engine",
    "GenerationParams": "hetero_infer.engine.inference_engine",
    "CompletedRequest": "hetero_infer.engine.inference_engine",
    "MemoryStats": "hetero_infer.engine.inference_engine",
    # Errors (both seeds' names).
    "EngineError": "hetero_infer.engine.exceptions",
    "ConfigError": "hetero_infer.engine.exceptions",
    "ModelNotFoundError": "hetero_infer.engine.exceptions",
    "ValidationError": "hetero_infer.engine.exceptions",
    "InvalidRequestError": "hetero_infer.engine.exceptions",
    "OutOfMemoryError": "hetero_infer.engine.exceptions",
    "SchedulerError": "hetero_infer.engine.exceptions",
    "ExecutionError": "hetero_infer.engine.exceptions",
    # What an entry point applies to its process (see engine/process_settings.py).
    "set_openmp_wait_policy": "hetero_infer.engine.process_settings",
    "apply_process_settings": "hetero_infer.engine.process_settings",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
