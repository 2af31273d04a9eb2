"""Model registry: Hugging Face architecture name -> our implementation, built from a
ModelConfig (config.py) into a CausalLM (protocol.py)."""

from __future__ import annotations

from hetero_infer.engine.models.config import (
    SUPPORTED_ARCHITECTURES,
    ModelConfig,
    architecture_of,
)
from hetero_infer.engine.models.llama import LlamaForCausalLM
from hetero_infer.engine.models.protocol import CausalLM, TensorParallel
from hetero_infer.kernels import Kernels

MODEL_REGISTRY: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}
assert set(MODEL_REGISTRY) == set(SUPPORTED_ARCHITECTURES), "config.py and the registry differ"


def build_model(
    config: ModelConfig, kernels: Kernels, tp: TensorParallel | None = None
) -> CausalLM:
    """The model for `config`, calling `kernels` (chosen once: kernels.select_kernels);
    with `tp`, this rank's share of it. Build it under torch.device("meta"), then
    load_weights and pack_weights: its own initialization would only be overwritten."""
    if tp is None:
        return MODEL_REGISTRY[config.architecture](config, kernels)
    return MODEL_REGISTRY[config.architecture](config, kernels, tp)


__all__ = [
    "MODEL_REGISTRY",
    "CausalLM",
    "ModelConfig",
    "architecture_of",
    "build_model",
]
