"""A model's weights from either format, in one shape: Hugging Face names, `dtype`, CPU."""

from __future__ import annotations

import logging
import time

import torch
from hetero_infer.engine.exceptions import ConfigError
from hetero_infer.engine.loader.gguf import load_gguf
from hetero_infer.engine.loader.safetensors import load_safetensors
from hetero_infer.engine.loader.source import ModelSource

logger = logging.getLogger(__name__)


def load_state_dict(source: ModelSource, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """All weights, keyed by HF parameter names, dequantized to `dtype`, on CPU."""
    start = time.perf_counter()
    if source.is_gguf:
        state_dict = load_gguf(source.path, dtype)
    else:
        state_dict = load_safetensors(source.path, dtype)
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
