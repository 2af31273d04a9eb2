"""The model families the decoder runs, and what sets each apart beyond its config's
numbers: the layer's parts (q/k norms, norms after attention and the MLP), how its
checkpoints name and store them, and llama.cpp's name for it in GGUF files.

One decoder (decoder.py) runs them all; a family is a row here and, where its HF
config keeps a setting its own way, a rule in config.py. A family not listed is refused
at start, naming its architecture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero_infer.engine.settings.exceptions import ConfigError


@dataclass(frozen=True)
class Family:
    """One model family, under its Hugging Face architecture name."""

    architecture: str  # e.g. "LlamaForCausalLM"
    model_type: str  # the HF config's model_type (a GGUF-converted config may name no architecture)
    gguf_arch: str  # llama.cpp's general.architecture
    # llama.cpp's converter permutes q/k rows for these (its RoPE pairs adjacent dims).
    gguf_permuted_qk: bool = False
    # An RMSNorm over each head of q and k, before RoPE (Qwen3, Gemma 3).
    qk_norm: bool = False
    # The q and k norms span all heads at once, one weight per value of the projection
    # (OLMoE's), instead of each head's head_dim values.
    qk_norm_across_heads: bool = False
    # Gemma's layout: norms after attention and after the MLP too, an embedding scaled
    # by sqrt(hidden), RMSNorm weights stored as (weight - 1).
    gemma: bool = False
    # q/k/v and gate/up fused in its checkpoints, under our merged names (Phi-3).
    fused_projections: bool = False
    # Sparse layers of routed experts (moe_config.py, moe.py).
    mixture_of_experts: bool = False
    # Activations with outlier channels: the quantized CPU kernel rounds the inputs of
    # the layers' projections to 16 bits per block of 32 values (the lm_head's stay
    # int8: engine/models/decoder_weights.py), not int8, whose step (the block's
    # largest value / 127) leaves the block's other values few levels. Measured on
    # Gemma-3-270M Q4_K_M, teacher-forced against fp32: int8 moved each token's logprob
    # by 0.078 (rms), 16 bits by 0.041, as bf16 on the dequantized weights (0.043).
    activation_outliers: bool = False
    # Checkpoint parameter names (a part of a dotted name) -> ours, where they differ.
    renames: dict[str, str] = field(default_factory=dict)
    # The chat template (chat_templates/<name>.jinja) for a tokenizer that carries none,
    # as the family's GGUF files often do not.
    chat_template: str | None = None
    # The token that ends a chat turn, where it is not the tokenizer's eos: generation
    # stops on it too (Gemma's <end_of_turn>, as its generation_config lists).
    end_of_turn: str | None = None


# Gemma names its norms by where they sit; ours keep Llama's names, plus two for the
# norms Llama does not have.
GEMMA_NORMS = {
    "post_attention_layernorm": "attn_output_norm",
    "pre_feedforward_layernorm": "post_attention_layernorm",
    "post_feedforward_layernorm": "mlp_output_norm",
}

# What every Gemma shares: its layout, its names, its chat format.
GEMMA: dict[str, Any] = dict(
    gemma=True, renames=GEMMA_NORMS, chat_template="gemma", end_of_turn="<end_of_turn>"
)

# Mixtral's checkpoints name the MoE block and its experts' projections their own way.
MIXTRAL_NAMES = {
    "block_sparse_moe": "mlp",
    "w1": "gate_proj",
    "w3": "up_proj",
    "w2": "down_proj",
}

FAMILIES = (
    Family("LlamaForCausalLM", "llama", "llama", gguf_permuted_qk=True),
    Family("MistralForCausalLM", "mistral", "llama", gguf_permuted_qk=True),
    Family("Qwen2ForCausalLM", "qwen2", "qwen2"),
    Family("Qwen3ForCausalLM", "qwen3", "qwen3", qk_norm=True),
    Family("Phi3ForCausalLM", "phi3", "phi3", fused_projections=True),
    # Gemma 3 without q/k norms, with attention and final logit soft-capping (config.py).
    Family("Gemma2ForCausalLM", "gemma2", "gemma2", **GEMMA),
    Family(
        "Gemma3ForCausalLM",
        "gemma3_text",
        "gemma3",
        qk_norm=True,
        activation_outliers=True,
        **GEMMA,
    ),
    # Mixture-of-experts families (moe_config.py, moe.py). llama.cpp files Mixtral under
    # "llama", telling it apart by its expert count (loader/gguf.py).
    Family(
        "MixtralForCausalLM",
        "mixtral",
        "llama",
        gguf_permuted_qk=True,
        renames=MIXTRAL_NAMES,
        mixture_of_experts=True,
    ),
    Family("Qwen2MoeForCausalLM", "qwen2_moe", "qwen2moe", mixture_of_experts=True),
    Family("Qwen3MoeForCausalLM", "qwen3_moe", "qwen3moe", qk_norm=True, mixture_of_experts=True),
    Family(
        "OlmoeForCausalLM",
        "olmoe",
        "olmoe",
        qk_norm=True,
        qk_norm_across_heads=True,
        mixture_of_experts=True,
    ),
    # SmolVLM: a Llama text model behind a SigLIP vision tower (models/idefics3.py).
    # Last: llama.cpp files its text model under "llama", which stays Llama's.
    Family("Idefics3ForConditionalGeneration", "idefics3", "llama"),
    # Gemma 3 with images (models/gemma3_mm.py); last, so "gemma3" GGUFs stay Gemma3ForCausalLM's.
    Family(
        "Gemma3ForConditionalGeneration",
        "gemma3",
        "gemma3",
        qk_norm=True,
        activation_outliers=True,
        **GEMMA,
    ),
    # Qwen2.5-VL: a Qwen2 text model with M-RoPE behind its vision transformer
    # (models/qwen2_5_vl.py); llama.cpp files that text model as "qwen2vl", never as
    # Qwen2's "qwen2".
    Family("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", "qwen2vl"),
)
BY_ARCHITECTURE = {family.architecture: family for family in FAMILIES}
BY_GGUF_ARCH = {family.gguf_arch: family for family in reversed(FAMILIES)}  # llama: Llama
# A GGUF architecture's family where the file has experts (llama: Mixtral)
BY_GGUF_MOE_ARCH = {f.gguf_arch: f for f in FAMILIES if f.mixture_of_experts}
# The HF architecture names the decoder runs.
SUPPORTED_ARCHITECTURES = tuple(BY_ARCHITECTURE)


def family_of(config: Any) -> Family:
    """The family of a transformers config, or ConfigError naming what is unsupported."""
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        if name in BY_ARCHITECTURE:
            return BY_ARCHITECTURE[name]
    model_type = getattr(config, "model_type", None)
    if not names:
        for family in FAMILIES:
            if family.model_type == model_type:
                return family
    found = ", ".join(names) or f"model_type {model_type!r}"
    raise ConfigError(
        f"unsupported model architecture {found}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def architecture_of(config: Any) -> str:
    """The HF config's architecture name, or ConfigError (a ValueError) naming what is
    unsupported."""
    return family_of(config).architecture


def family_chat_template(family: Family) -> str | None:
    """The family's own chat template (Jinja text), or None."""
    if family.chat_template is None:
        return None
    return (Path(__file__).parent / "chat_templates" / f"{family.chat_template}.jinja").read_text()
