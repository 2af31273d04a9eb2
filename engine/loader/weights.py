"""A model's weights from either format, in one shape: Hugging Face names, `dtype`, CPU."""

from __future__ import annotations

import collections
import logging
import math
import time

import torch
from hetero_infer.engine.loader.gguf import load_gguf
from hetero_infer.engine.loader.int8 import (
    COMPRESSED_TENSORS,
    checkpoint_quantization,
    quantize_linear_weights,
    take_int8_weights,
)
from hetero_infer.engine.loader.safetensors import load_safetensors
from hetero_infer.engine.loader.source import ModelSource
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import QuantizedWeight

logger = logging.getLogger(__name__)

# The embedding's name in a checkpoint: a decoder's, or a vision-language model's text
# model's (Idefics3: model.text_model; Gemma 3: language_model.model as the Hub's files
# and transformers 5 name it, model.language_model as transformers 4.5x did).
EMBED_TOKENS_NAMES = {
    "model.embed_tokens.weight",
    "model.text_model.embed_tokens.weight",
    "language_model.model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
}


def checkpoint_quantized_by(source: ModelSource) -> str | None:
    """How the checkpoint's weights are quantized as stored: "gguf", "compressed-tensors"
    (int8), or None for float weights."""
    if source.is_gguf:
        return "gguf"
    quantized = checkpoint_quantization(source.path) is not None
    return COMPRESSED_TENSORS if quantized else None


def load_state_dict(
    source: ModelSource,
    dtype: torch.dtype,
    keep_quantized: bool = False,
    quantize_int8: bool = False,
) -> dict[str, torch.Tensor | QuantizedWeight]:
    """All weights, keyed by HF parameter names, on CPU: dequantized to `dtype`, or with
    ``keep_quantized`` a GGUF file's quantized matrices and a compressed-tensors
    checkpoint's int8 ones as they are stored. ``quantize_int8``: a float checkpoint's
    linear weights quantized to int8 per row."""
    start = time.perf_counter()
    if source.is_gguf:
        state_dict = load_gguf(source.path, dtype, keep_quantized)
    else:
        state_dict = load_safetensors(source.path, dtype)
        if checkpoint_quantization(source.path) is not None:
            take_int8_weights(state_dict, dtype, keep_quantized)
        elif quantize_int8:
            quantize_linear_weights(state_dict)
    # (A vision-language model's decoder is its text model, under its own name.)
    if not EMBED_TOKENS_NAMES & set(state_dict):
        # E.g. a bare LlamaModel checkpoint, whose keys lack the "model." prefix.
        raise ConfigError(
            f"model {str(source.path)!r}: no model.embed_tokens.weight among the weights; "
            "is this a *ForCausalLM checkpoint?"
        )
    num_params = sum(math.prod(t.shape) for t in state_dict.values())
    num_bytes = sum(_nbytes(t) for t in state_dict.values())
    logger.info(
        "loaded %d tensors (%.1fM params, %.0f MB, %s) from %s in %.1f s",
        len(state_dict),
        num_params / 1e6,
        num_bytes / 1e6,
        _describe_types(state_dict, dtype),
        source.path,
        time.perf_counter() - start,
    )
    return state_dict


def _nbytes(tensor: torch.Tensor | QuantizedWeight) -> int:
    if isinstance(tensor, QuantizedWeight):
        return tensor.nbytes
    return tensor.numel() * tensor.element_size()


def _describe_types(
    state_dict: dict[str, torch.Tensor | QuantizedWeight], dtype: torch.dtype
) -> str:
    """E.g. "torch.bfloat16, 210 kept quantized (Q4_1: 210)"."""
    quantized = collections.Counter(
        t.qtype for t in state_dict.values() if isinstance(t, QuantizedWeight)
    )
    if not quantized:
        return str(dtype)
    counts = ", ".join(f"{qtype}: {n}" for qtype, n in sorted(quantized.items()))
    return f"{dtype}, {sum(quantized.values())} kept quantized ({counts})"
