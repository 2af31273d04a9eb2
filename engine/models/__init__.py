"""Model registry: Hugging Face architecture name -> our implementation."""

from __future__ import annotations

from typing import Any

from hetero_infer.engine.exceptions import ConfigError
from hetero_infer.engine.models.llama import LlamaForCausalLM
from torch import nn

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}
# Configs read from GGUF files may name no architecture, only a model type.
MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


def architecture_of(config: Any) -> str:
    """The config's architecture name, or ValueError naming what is unsupported."""
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        if name in MODEL_REGISTRY:
            return name
    model_type = getattr(config, "model_type", None)
    if not names and model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    found = ", ".join(names) or f"model_type {model_type!r}"
    raise ConfigError(
        f"unsupported model architecture {found}; supported: {', '.join(MODEL_REGISTRY)}"
    )


def build_model(config: Any) -> nn.Module:
    return MODEL_REGISTRY[architecture_of(config)](config)
