"""ModelConfig: the model's shape and options, read once from its Hugging Face config.

Hugging Face configs differ by architecture and by transformers version (where RoPE's
settings live, which layers slide, which projections carry biases); those rules live
here, so the model code and the runner read typed fields and never the HF config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hetero_infer.engine.models.architectures import family_of
from hetero_infer.engine.models.kv_layout import KVLayout
from hetero_infer.engine.models.moe_config import MoeSettings, moe_settings
from hetero_infer.engine.models.vision_settings import VisionSettings, vision_settings
from hetero_infer.engine.settings.exceptions import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # e.g. "LlamaForCausalLM"
    model_type: str  # e.g. "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    # None for plain RoPE; else transformers' scaling dict ("rope_type", "factor", ...).
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    # The attention window of each layer; None = full attention.
    sliding_windows: tuple[int | None, ...]
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    hidden_act: str
    # The config's own eos ids (generation may stop on more than the tokenizer marks).
    eos_token_ids: tuple[int, ...]
    # The layer's parts beyond Llama's (architectures.py says which family has which):
    # an RMSNorm over each head of q and k before RoPE; RMSNorms on the attention's and
    # the MLP's outputs too, before each joins the residual stream.
    qk_norm: bool = False
    # The q/k norms over all heads at once (OLMoE), not per head.
    qk_norm_across_heads: bool = False
    sandwich_norms: bool = False
    # Checkpoints store RMSNorm weights as (weight - norm_weight_offset): Gemma's 1.
    norm_weight_offset: float = 0.0
    # The embeddings are multiplied by this (Gemma: sqrt(hidden_size)).
    embedding_multiplier: float = 1.0
    # Attention's softmax scale; None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar's).
    attention_scale: float | None = None
    # RoPE's base on the sliding-window layers, where it differs from rope_theta (Gemma 3:
    # 10,000 there, 1,000,000 on the global layers); their RoPE is never scaled.
    sliding_rope_theta: float | None = None
    # The dims of each head RoPE rotates (Phi-4-mini: 3/4 of them); None: all.
    rotary_dim: int | None = None
    # tanh soft-capping, cap * tanh(x / cap), of attention's scaled scores and of the
    # logits (Gemma 2: 50 and 30); None: none.
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    # What the quantized CPU kernel rounds activations to, per block of 32 values: 8
    # bits, or 16 for a family with outlier channels (Family.activation_outliers).
    quantized_activation_bits: int = 8
    # Mixture-of-experts layers (moe_config.py), None for a dense model.
    moe: MoeSettings | None = None
    # A vision-language model's image side (vision_settings.py), None for text only.
    vision: VisionSettings | None = None
    # M-RoPE (Qwen2-VL, Qwen2.5-VL; models/mrope.py): how many of a head's rotary
    # frequencies each of a token's (time, height, width) positions turns, in that order;
    # they sum to rotary_dim / 2. None: one position per token, as any other model.
    mrope_section: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.sliding_windows) != self.num_layers:
            raise ConfigError(
                f"{len(self.sliding_windows)} layer types for {self.num_layers} layers"
            )

    @classmethod
    def from_hf(cls, config: Any) -> ModelConfig:
        """From a transformers config (4.x or 5.x); ConfigError for an architecture we
        do not run. A vision-language model's decoder is its text model's."""
        family = family_of(config)
        vision = vision_settings(config)
        # A vision model's lm_head is tied as its text config says, or where that does not
        # say (Qwen2.5-VL's, built from the Hub's config.json), as the whole config does.
        tied = getattr(config, "tie_word_embeddings", False)
        if vision is not None:
            config = config.get_text_config()
        tied = getattr(config, "tie_word_embeddings", tied)
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        # Qwen2's q/k/v have biases whatever attention_bias says (Qwen2-MoE's config
        # names it qkv_bias); o_proj has none. Qwen2.5-VL's text model is Qwen2's.
        is_qwen2 = config.model_type in ("qwen2", "qwen2_moe", "qwen2_5_vl_text")
        if getattr(config, "clip_qkv", None) is not None:
            raise ConfigError(
                f"{family.architecture}: clip_qkv ({config.clip_qkv}) is not supported"
            )
        rope_theta, rope_scaling, sliding_rope_theta = _rope_settings(config)
        if (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type")) in (
            "longrope",
            "su",  # its name in Phi-3's first configs
        ):
            rope_scaling = _longrope(config, rope_scaling)
        partial_rotary = getattr(config, "partial_rotary_factor", None) or (
            getattr(config, "rope_parameters", None) or {}
        ).get("partial_rotary_factor", 1.0)
        rotary_dim = int(head_dim * partial_rotary)
        if rotary_dim % 2 or rotary_dim <= 0:
            raise ConfigError(
                f"{family.architecture}: partial_rotary_factor {partial_rotary} rotates "
                f"{rotary_dim} of {head_dim} dims; RoPE needs an even, positive count"
            )
        pre_attn_scalar = getattr(config, "query_pre_attn_scalar", None)
        return cls(
            architecture=family.architecture,
            model_type=config.model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rotary_dim=rotary_dim if rotary_dim < head_dim else None,
            max_position_embeddings=config.max_position_embeddings,
            sliding_windows=_layer_sliding_windows(config),
            tie_word_embeddings=bool(tied),
            # Qwen2 has biases on q/k/v only, whatever attention_bias says.
            qkv_bias=bool(getattr(config, "qkv_bias", True)) if is_qwen2 else attention_bias,
            o_bias=not is_qwen2 and attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            # Gemma's config names it hidden_activation.
            hidden_act=getattr(config, "hidden_activation", None) or config.hidden_act,
            eos_token_ids=_eos_token_ids(config),
            qk_norm=family.qk_norm,
            qk_norm_across_heads=family.qk_norm_across_heads,
            sandwich_norms=family.gemma,
            norm_weight_offset=1.0 if family.gemma else 0.0,
            embedding_multiplier=config.hidden_size**0.5 if family.gemma else 1.0,
            attention_scale=None if pre_attn_scalar is None else pre_attn_scalar**-0.5,
            sliding_rope_theta=sliding_rope_theta,
            attn_logit_softcap=getattr(config, "attn_logit_softcapping", None),
            final_logit_softcap=getattr(config, "final_logit_softcapping", None),
            quantized_activation_bits=16 if family.activation_outliers else 8,
            moe=moe_settings(config),
            vision=vision,
            mrope_section=_mrope_section(config),
        )

    @property
    def softmax_scale(self) -> float:
        """Attention's softmax scale."""
        return self.head_dim**-0.5 if self.attention_scale is None else self.attention_scale

    @property
    def kv_layout(self) -> KVLayout:
        """The layers' KV cache groups (kv_layout.py)."""
        return KVLayout.of(self.sliding_windows)

    def resolve_max_model_len(self, requested: int | None) -> int:
        """The context length to serve: ``requested`` (the engine's max_model_len), which
        may not exceed the model's max_position_embeddings; None: the model's own."""
        limit = self.max_position_embeddings
        if requested is None:
            return limit
        if requested > limit:
            raise ConfigError(
                f"max_model_len ({requested}) is larger than the model's "
                f"max_position_embeddings ({limit})"
            )
        return requested


def _rope_settings(config: Any) -> tuple[float, dict[str, Any] | None, float | None]:
    """(rope_theta, scaling dict or None, the sliding layers' own theta or None), for
    transformers 4.x and 5.x configs alike. Gemma 3's 5.x config keeps one set of
    parameters per layer type."""
    params = getattr(config, "rope_parameters", None)
    sliding_theta = getattr(config, "rope_local_base_freq", None)
    if params and "full_attention" in params:
        sliding_theta = params.get("sliding_attention", {}).get("rope_theta", sliding_theta)
        params = params["full_attention"]
    if params:
        params = dict(params)
        theta = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        scaling = params if params.get("rope_type", "default") != "default" else None
    else:
        scaling = getattr(config, "rope_scaling", None)
        theta = float(getattr(config, "rope_theta", 10000.0))
        # A copy: the HF config's own dict must not change under a frozen ModelConfig.
        scaling = dict(scaling) if scaling else None
        # transformers 4.x's M-RoPE ("mrope", or "default" with mrope_section): the
        # frequencies are plain RoPE's (ModelConfig.mrope_section splits them).
        if scaling and scaling.get("rope_type", scaling.get("type")) in ("mrope", "default"):
            scaling = None
    if sliding_theta is not None and float(sliding_theta) == theta:
        sliding_theta = None
    return theta, scaling, None if sliding_theta is None else float(sliding_theta)


def _mrope_section(config: Any) -> tuple[int, ...] | None:
    """M-RoPE's sections, which transformers 5 keeps in rope_parameters (its rope_type
    "default": the frequencies are plain RoPE's, only split among the positions) and 4.x
    in rope_scaling (rope_type "mrope" or "default"); None for every other model."""
    for name in ("rope_parameters", "rope_scaling"):
        section = (getattr(config, name, None) or {}).get("mrope_section")
        if section:
            return tuple(int(n) for n in section)
    return None


def _longrope(config: Any, scaling: dict[str, Any]) -> dict[str, Any]:
    """LongRoPE's settings with the original context and the attention factor filled
    in as transformers derives them (Phi-3 keeps the first as a config attribute)."""
    original = scaling.get("original_max_position_embeddings") or getattr(
        config, "original_max_position_embeddings", None
    )
    if original is None:
        raise ConfigError("longrope scaling needs original_max_position_embeddings")
    factor = scaling.get("factor") or config.max_position_embeddings / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    return {
        **scaling,
        "rope_type": "longrope",
        "original_max_position_embeddings": original,
        "attention_factor": attention_factor,
    }


def _layer_sliding_windows(config: Any) -> tuple[int | None, ...]:
    """The sliding attention window of each layer (None = full attention)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    n = config.num_hidden_layers
    if window is None:
        return (None,) * n
    if layer_types is not None:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    if config.model_type == "gemma2":
        # A config from before layer_types: Gemma 2's even layers slide, as its
        # transformers 4.x layers decided by index (and the default layer_types say).
        return tuple(window if i % 2 == 0 else None for i in range(n))
    if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
        return (None,) * n
    return (window,) * n


def _eos_token_ids(config: Any) -> tuple[int, ...]:
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)
