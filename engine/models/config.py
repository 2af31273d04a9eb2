"""ModelConfig: the model's shape and options, read once from its Hugging Face config.

Hugging Face configs differ by architecture and by transformers version (where RoPE's
settings live, which layers slide, which projections carry biases); those rules live
here, so the model code and the runner read typed fields and never the HF config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero_infer.engine.exceptions import ConfigError

# Configs read from GGUF files may name no architecture, only a model type.
MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
# The HF architecture names models/ runs (the registry maps each to its class).
SUPPORTED_ARCHITECTURES = tuple(MODEL_TYPES.values())


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

    def __post_init__(self) -> None:
        if len(self.sliding_windows) != self.num_layers:
            raise ConfigError(
                f"{len(self.sliding_windows)} layer types for {self.num_layers} layers"
            )

    @classmethod
    def from_hf(cls, config: Any) -> ModelConfig:
        """From a transformers config (4.x or 5.x); ConfigError for an architecture we
        do not run."""
        architecture = architecture_of(config)
        num_heads = config.num_attention_heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        is_qwen2 = config.model_type == "qwen2"
        rope_theta, rope_scaling = _rope_settings(config)
        return cls(
            architecture=architecture,
            model_type=config.model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=config.max_position_embeddings,
            sliding_windows=_layer_sliding_windows(config),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            # Qwen2 has biases on q/k/v only, whatever attention_bias says.
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=not is_qwen2 and attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            hidden_act=config.hidden_act,
            eos_token_ids=_eos_token_ids(config),
        )

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


def architecture_of(config: Any) -> str:
    """The HF config's architecture name, or ConfigError (a ValueError) naming what is
    unsupported."""
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    model_type = getattr(config, "model_type", None)
    if not names and model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    found = ", ".join(names) or f"model_type {model_type!r}"
    raise ConfigError(
        f"unsupported model architecture {found}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _rope_settings(config: Any) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling dict or None), for transformers 4.x and 5.x configs alike."""
    params = getattr(config, "rope_parameters", None)
    if params:
        params = dict(params)
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        scaling = params if params.get("rope_type", "default") != "default" else None
        return float(theta), scaling
    scaling = getattr(config, "rope_scaling", None)
    # A copy: the HF config's own dict must not change under a frozen ModelConfig.
    return float(getattr(config, "rope_theta", 10000.0)), dict(scaling) if scaling else None


def _layer_sliding_windows(config: Any) -> tuple[int | None, ...]:
    """The sliding attention window of each layer (None = full attention)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    n = config.num_hidden_layers
    if window is None:
        return (None,) * n
    if layer_types is not None:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
        return (None,) * n
    return (window,) * n


def _eos_token_ids(config: Any) -> tuple[int, ...]:
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)
