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
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.kernels import AttentionMetadata
from torch import nn


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
    def __init__(self, config: ModelConfig, sliding_window: int | None) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.sliding_window = sliding_window
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias
        )
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.o_bias)

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
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.mlp_bias
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
    def __init__(self, config: ModelConfig, sliding_window: int | None) -> None:
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
    """A CausalLM (models/protocol.py)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.num_layers = config.num_layers
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.sliding_windows = set(config.sliding_windows)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, w) for w in config.sliding_windows)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = config.tie_word_embeddings
        self.lm_head = None
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope_cos = self.rope_sin = None

    def init_rope(self, device: torch.device) -> None:
        """Build the cos/sin tables (kept outside the parameters, which load from a checkpoint)."""
        config = self.config
        inv_freq = kernels.rope_inv_freq(self.head_dim, config.rope_theta, config.rope_scaling)
        cos, sin = kernels.rope_cos_sin(inv_freq, config.max_position_embeddings)
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
