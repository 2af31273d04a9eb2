"""The Llama family (Llama 1-3, SmolLM2, Mistral, Qwen2) over a paged KV cache.

One forward pass serves every scheduled sequence of a step: tokens are packed
into [num_tokens, hidden] and attention finds each token's context through the
block tables in AttentionMetadata. q/k/v and gate/up projections are merged
into one matmul each. Parameter names follow Hugging Face's, so checkpoints load
by name; ``load_weights`` does the merging.
"""

from __future__ import annotations

from typing import Any

import torch
from hetero_infer import kernels
from hetero_infer.engine.exceptions import ConfigError
from hetero_infer.kernels import AttentionMetadata
from torch import nn


def rope_settings(config: Any) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling dict or None), for transformers 4.x and 5.x configs alike."""
    params = getattr(config, "rope_parameters", None)
    if params:
        params = dict(params)
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        scaling = params if params.get("rope_type", "default") != "default" else None
        return float(theta), scaling
    return float(getattr(config, "rope_theta", 10000.0)), getattr(config, "rope_scaling", None)


def layer_sliding_windows(config: Any) -> list[int | None]:
    """The sliding attention window of each layer (None = full attention)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    n = config.num_hidden_layers
    if window is None:
        return [None] * n
    if layer_types is not None:
        return [window if t == "sliding_attention" else None for t in layer_types]
    if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
        return [None] * n
    return [window] * n


class DirectCall:
    """A module whose calls go straight to forward, past nn.Module.__call__'s hook
    handling: the model's inner modules never carry hooks, and a step makes ~300 such
    calls (0.3 ms of a 10 ms batch-1 step on a 2-core CPU, measured). The model itself
    keeps the usual __call__."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)


class Linear(DirectCall, nn.Linear):
    """nn.Linear through kernels.linear (a faster CPU path for small decode batches)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.linear(x, self.weight, self.bias)


class Attention(DirectCall, nn.Module):
    def __init__(self, config: Any, sliding_window: int | None) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or (config.hidden_size // self.num_heads)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.sliding_window = sliding_window
        qkv_bias = config.model_type == "qwen2" or getattr(config, "attention_bias", False)
        o_bias = config.model_type != "qwen2" and getattr(config, "attention_bias", False)
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=qkv_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=o_bias)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = kernels.rotary(positions, q, k, *rope)
        k_cache, v_cache = kv_cache
        kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = kernels.paged_attention(q, k_cache, v_cache, meta, self.scale, self.sliding_window)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class MLP(DirectCall, nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=bias)
        if config.hidden_act != "silu":
            raise ConfigError(f"hidden_act {config.hidden_act!r} is not supported (only silu)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj
        return self.down_proj(kernels.silu_and_mul_linear(x, gate_up.weight, gate_up.bias))


class RMSNorm(DirectCall, nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (norm(x + residual), x + residual); with no residual, x is the residual."""
        if residual is None:
            return kernels.rms_norm(x, self.weight, self.eps), x
        return kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)


class DecoderLayer(DirectCall, nn.Module):
    def __init__(self, config: Any, sliding_window: int | None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, sliding_window)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, residual, positions, rope, kv_cache, meta):
        x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, positions, rope, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        windows = layer_sliding_windows(config)
        self.sliding_windows = set(windows)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, w) for w in windows)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = None
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        attn = self.layers[0].self_attn
        self.num_kv_heads = attn.num_kv_heads
        self.head_dim = attn.head_dim
        self.rope_cos = self.rope_sin = None

    def init_rope(self, device: torch.device) -> None:
        """Build the cos/sin tables (kept outside the parameters, which load from a checkpoint)."""
        theta, scaling = rope_settings(self.config)
        inv_freq = kernels.rope_inv_freq(self.head_dim, theta, scaling)
        cos, sin = kernels.rope_cos_sin(inv_freq, self.config.max_position_embeddings)
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids, positions [num_tokens] -> final hidden states [num_tokens, hidden]."""
        x = self.embed_tokens(input_ids)
        residual = None
        rope = (self.rope_cos, self.rope_sin)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, positions, rope, kv_cache, meta)
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden] -> logits [n, vocab] in the model's dtype (the sampler
        converts to fp32 where it needs to: the greedy pick reads them as they are)."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return kernels.linear(hidden, weight)

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load Hugging Face-named tensors, merging q/k/v and gate/up."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()

        def put(name: str, tensor: torch.Tensor) -> None:
            if name not in params:
                raise ConfigError(f"checkpoint tensor for unknown parameter {name!r}")
            if params[name].shape != tensor.shape:
                raise ConfigError(
                    f"{name}: checkpoint shape {tuple(tensor.shape)} does not match the "
                    f"model's {tuple(params[name].shape)}"
                )
            params[name].copy_(tensor)
            loaded.add(name)

        merged: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in state_dict.items():
            name = name.removeprefix("model.")
            if "rotary_emb" in name:
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # tied to the embedding
            for part, target, order in (
                ("q_proj", "qkv_proj", 0),
                ("k_proj", "qkv_proj", 1),
                ("v_proj", "qkv_proj", 2),
                ("gate_proj", "gate_up_proj", 0),
                ("up_proj", "gate_up_proj", 1),
            ):
                if f".{part}." in name:
                    merged_name = name.replace(part, target)
                    merged.setdefault(merged_name, {})[order] = tensor
                    break
            else:
                put(name, tensor)
        for name, parts in merged.items():
            put(name, torch.cat([parts[i] for i in sorted(parts)], dim=0))
        missing = set(params) - loaded
        if missing:
            raise ConfigError(f"checkpoint is missing parameters: {sorted(missing)[:5]}")
