"""A mixture-of-experts model's settings, read once from its Hugging Face config.

The families differ in three ways, each a field here: which layers are sparse (Qwen2-
and Qwen3-MoE may keep dense MLPs in some layers: ``mlp_only_layers``, and
``decoder_sparse_step``), how the router's top-k probabilities are scaled (Mixtral and
Qwen3-MoE renormalize them to sum to one, Qwen1.5-MoE and OLMoE keep the softmax's
values) and whether a shared expert, gated by a sigmoid, runs beside the routed ones
(Qwen2-MoE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero_infer.engine.settings.exceptions import ConfigError

# model_type -> whether its router always renormalizes the top-k probabilities (True),
# or as its config's norm_topk_prob says (None).
RENORMALIZES = {"mixtral": True, "qwen2_moe": None, "qwen3_moe": None, "olmoe": None}


@dataclass(frozen=True)
class MoeSettings:
    num_experts: int
    top_k: int  # experts per token
    expert_intermediate_size: int
    # Whether the top-k softmax probabilities are divided by their sum.
    renormalize: bool
    # Which layers route to experts; the others run the dense MLP (intermediate_size).
    sparse_layers: tuple[bool, ...]
    # A shared expert of this width on every sparse layer, 0 for none (Qwen2-MoE); its
    # output is scaled by sigmoid(x . shared_expert_gate).
    shared_expert_intermediate_size: int

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ConfigError(
                f"num_experts_per_tok ({self.top_k}) must be between 1 and the number of "
                f"experts ({self.num_experts})"
            )


def moe_settings(config: Any) -> MoeSettings | None:
    """The MoE settings of a transformers config, or None for a dense model."""
    model_type = config.model_type
    if model_type not in RENORMALIZES:
        return None
    num_experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", 0)
    n = config.num_hidden_layers
    if model_type in ("qwen2_moe", "qwen3_moe"):
        dense = set(getattr(config, "mlp_only_layers", None) or [])
        step = getattr(config, "decoder_sparse_step", 1) or 1
        sparse = tuple(i not in dense and num_experts > 0 and (i + 1) % step == 0 for i in range(n))
        width = config.moe_intermediate_size
    else:  # Mixtral and OLMoE: every layer, experts as wide as intermediate_size
        sparse = (True,) * n
        width = config.intermediate_size
    renormalize = RENORMALIZES[model_type]
    if renormalize is None:
        renormalize = bool(getattr(config, "norm_topk_prob", False))
    shared = 0
    if model_type == "qwen2_moe":
        shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
    return MoeSettings(
        num_experts=num_experts,
        top_k=config.num_experts_per_tok,
        expert_intermediate_size=width,
        renormalize=renormalize,
        sparse_layers=sparse,
        shared_expert_intermediate_size=shared,
    )
