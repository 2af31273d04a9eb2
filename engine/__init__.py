"""Hetero-Paged-Infer's engine: continuous batching over a paged KV cache.

``from hetero_infer.engine import LLMEngine, EngineConfig, SamplingParams`` (vLLM's and mini-infer's
API), or ``from hetero_infer.engine import InferenceEngine, GenerationParams`` (the Rust seed's).
Names load on first use, so importing one small part (e.g. engine.block_manager) stays
cheap.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# How long torch's OpenMP threads spin before they sleep between parallel regions. A
# decode step runs hundreds of short regions: waking sleeping threads for each one
# made a batch-1 step 18 ms where spinning threads took 13 ms. But threads that spin
# without end collapse when another process shares the cores (on 2 busy cores a
# batch-64 step took 4-5x as long as with sleeping threads), so they spin a short
# while (GOMP_SPINCOUNT 10000, ~0.1 ms) and then sleep: on an idle machine as fast as
# spinning, under contention 1.8x the sleeping threads' time. libgomp reads this when
# torch loads, so it only takes effect where the engine is imported first (the CLI and
# server are); an explicit OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")

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
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
