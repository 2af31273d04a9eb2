"""Model registry: Hugging Face architecture name -> our implementation, built from a
ModelConfig (config.py) into a CausalLM (protocol.py). Every family architectures.py
lists runs on the one decoder (decoder.py); a vision-language family adds its vision
side to it (idefics3.py, gemma3_mm.py, qwen2_5_vl.py)."""

from __future__ import annotations

from hetero_infer.engine.models.architectures import (
    SUPPORTED_ARCHITECTURES,
    architecture_of,
)
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.models.decoder import DecoderForCausalLM
from hetero_infer.engine.models.gemma3_mm import Gemma3ForConditionalGeneration
from hetero_infer.engine.models.idefics3 import Idefics3ForConditionalGeneration
from hetero_infer.engine.models.protocol import CausalLM, TensorParallel
from hetero_infer.engine.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from hetero_infer.kernels import Kernels

MODEL_REGISTRY: dict[str, type[CausalLM]] = {
    **dict.fromkeys(SUPPORTED_ARCHITECTURES, DecoderForCausalLM),
    "Idefics3ForConditionalGeneration": Idefics3ForConditionalGeneration,
    "Gemma3ForConditionalGeneration": Gemma3ForConditionalGeneration,
    "Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLForConditionalGeneration,
}


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
    "SUPPORTED_ARCHITECTURES",
    "CausalLM",
    "ModelConfig",
    "architecture_of",
    "build_model",
]
