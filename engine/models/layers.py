"""The layers of the decoder over a paged KV cache: linear projections whose weights
the kernels pack once after loading, attention, the gated MLP, RMSNorm, and the decoder
layer they make up. q/k/v and gate/up are merged into one projection each. A layer is
Llama's, with the parts other families add where the ModelConfig says (q/k norms, norms
after attention and the MLP, GELU, soft-capped attention scores).

With tensor parallelism a layer is built with this rank's share of the heads and MLP
columns and an ``all_reduce`` that sums o_proj's and down_proj's partial outputs over
the ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import (
    AttentionInputs,
    KernelOps,
    Kernels,
    LinearFn,
    PlanarWeight,
    QuantizedWeight,
    unfused,
)
from torch import nn


class DirectCall:
    """A module whose calls go straight to forward, past nn.Module.__call__'s hook
    handling: the model's inner modules never carry hooks, and a step makes ~300 such
    calls (0.3 ms of a 10 ms batch-1 step on a 2-core CPU, measured). The model itself
    keeps the usual __call__."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)


def not_packed(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("the model's weights are not packed: call pack_weights() after loading")


class Linear(DirectCall, nn.Linear):
    """nn.Linear whose weight ``pack`` prepares once, after loading (``pack_weight``):
    on the CPU a packed bf16 copy for a faster kernel (kernels/linear_cpu.py), or the
    checkpoint's quantized blocks (``quantized``, which then replaces the weight)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        pack: Callable[[torch.Tensor, torch.Tensor | None], LinearFn],
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.pack = pack
        self.packed: LinearFn = not_packed
        # PlanarWeight: the GPU kernels' repacked copy, kept in place of the file's.
        self.quantized: QuantizedWeight | PlanarWeight | None = None
        # With LoRA enabled (engine/lora/): (x, packed) -> the projection with the step's
        # adapters' updates added to their rows (before a merged gate_up's activation).
        self.lora: Callable[[torch.Tensor, LinearFn], torch.Tensor] | None = None

    def keep_quantized(self, weight: QuantizedWeight) -> None:
        self.quantized = weight
        self.weight = nn.Parameter(torch.empty(0, dtype=self.weight.dtype), requires_grad=False)

    def pack_weight(self) -> None:
        weight = self.weight if self.quantized is None else self.quantized
        self.packed = self.pack(weight, self.bias)
        # A kernel that repacked the blocks into a layout of its own (the GPU's planes)
        # holds the only copy: the loader's goes, and a later pack starts from it.
        repacked = getattr(unfused(self.packed), "repacked_weight", None)
        if repacked is not None:
            self.quantized = repacked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lora is not None:
            return self.lora(x, self.packed)
        return self.packed(x)


def pack_linears(module: nn.Module, skip: tuple[str, ...] = ()) -> None:
    """Every Linear in ``module`` packed for its kernel (pack_weight), but those whose
    names start with one of ``skip``."""
    for name, part in module.named_modules():
        if isinstance(part, Linear) and not name.startswith(skip):
            part.pack_weight()


class Attention(DirectCall, nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        kernels: Kernels,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """``layer``: the layer's index, for its attention window and KV cache group."""
        super().__init__()
        # Tensor parallel: o_proj's output is this rank's partial sum.
        self.all_reduce = all_reduce
        self.backend = kernels.attention
        self.rotary = kernels.ops.rotary
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = config.softmax_scale
        self.sliding_window = config.sliding_windows[layer]
        self.kv_group = config.kv_layout.layer_groups[layer]
        self.softcap = config.attn_logit_softcap
        pack = kernels.ops.pack_linear
        qkv_size = self.q_size + 2 * self.kv_size
        self.qkv_proj = Linear(config.hidden_size, qkv_size, config.qkv_bias, pack)
        self.o_proj = Linear(self.q_size, config.hidden_size, config.o_bias, pack)
        self.q_norm = self.k_norm = None
        # OLMoE's norms span every head's values at once; the others' each head's.
        self.qk_norm_across_heads = config.qk_norm_across_heads
        if config.qk_norm:
            q_width, k_width = self.head_dim, self.head_dim
            if config.qk_norm_across_heads:
                q_width, k_width = self.q_size, self.kv_size
            self.q_norm = RMSNorm(q_width, config.rms_norm_eps, kernels.ops)
            self.k_norm = RMSNorm(k_width, config.rms_norm_eps, kernels.ops)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionInputs,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm_across_heads:
            q, k = self.q_norm.each_row(q, self.q_size), self.k_norm.each_row(k, self.kv_size)
        elif self.q_norm is not None:
            q, k = self.q_norm.each_row(q, self.head_dim), self.k_norm.each_row(k, self.head_dim)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k, *rope)
        k_cache, v_cache = kv_cache
        meta = meta.for_group(self.kv_group)
        self.backend.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = self.backend.forward(
            q, k_cache, v_cache, meta, self.scale, self.sliding_window, self.softcap
        )
        out = self.o_proj(out.reshape(num_tokens, self.q_size))
        return out if self.all_reduce is None else self.all_reduce(out)


class MLP(DirectCall, nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        ops: KernelOps,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.all_reduce = all_reduce  # as Attention's, for down_proj
        bias = config.mlp_bias
        hidden, intermediate = config.hidden_size, config.intermediate_size
        # Gives act(gate) * up [num_tokens, intermediate]: the activation is part of the
        # projection, in one pass where a kernel fuses them.
        gated = {
            "silu": ops.pack_silu_and_mul_linear,
            "gelu_pytorch_tanh": ops.pack_gelu_tanh_and_mul_linear,
        }
        if config.hidden_act not in gated:
            raise ConfigError(
                f"hidden_act {config.hidden_act!r} is not supported (only {', '.join(gated)})"
            )
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias, gated[config.hidden_act])
        self.down_proj = Linear(intermediate, hidden, bias, ops.pack_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(self.gate_up_proj(x))
        return out if self.all_reduce is None else self.all_reduce(out)


class RMSNorm(DirectCall, nn.Module):
    def __init__(self, hidden_size: int, eps: float, ops: KernelOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.rms_norm, self.fused_add_rms_norm = ops.rms_norm, ops.fused_add_rms_norm

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (norm(x + residual), x + residual); with no residual, x is the residual."""
        if residual is None:
            return self.rms_norm(x, self.weight, self.eps), x
        return self.fused_add_rms_norm(x, residual, self.weight, self.eps)

    def each_row(self, x: torch.Tensor, size: int) -> torch.Tensor:
        """The norm over every ``size`` values of x [num_tokens, n * size] (each head),
        as a [num_tokens * n, size] batch: the kernels take contiguous rows."""
        rows = x.reshape(-1, size).contiguous()  # one head's rows are a strided view
        return self.rms_norm(rows, self.weight, self.eps).view(x.shape)


class DecoderLayer(DirectCall, nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        kernels: Kernels,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        mlp: nn.Module | None = None,
    ) -> None:
        super().__init__()
        ops = kernels.ops
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.self_attn = Attention(config, layer, kernels, all_reduce)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        # ``mlp``: a mixture-of-experts layer's experts (models/moe.py), in place of the
        # dense MLP.
        self.mlp = mlp if mlp is not None else MLP(config, ops, all_reduce)
        self.attn_output_norm = self.mlp_output_norm = None
        if config.sandwich_norms:
            self.attn_output_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
            self.mlp_output_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)

    def norms(self) -> dict[str, torch.Tensor]:
        """The layer's RMSNorm weights by their place, as DecoderLayerSpec.norms names
        them for the kernels."""
        attention = self.self_attn
        norms = {
            "input": self.input_layernorm,
            "post_attention": self.post_attention_layernorm,
            "q": attention.q_norm,
            "k": attention.k_norm,
            "attn_output": self.attn_output_norm,
            "mlp_output": self.mlp_output_norm,
        }
        return {place: norm.weight for place, norm in norms.items() if norm is not None}

    def forward(self, x, residual, positions, rope, kv_cache, meta):
        x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, positions, rope, kv_cache, meta)
        if self.attn_output_norm is not None:
            x, _ = self.attn_output_norm(x)
        x, residual = self.post_attention_layernorm(x, residual)
        x = self.mlp(x)
        if self.mlp_output_norm is not None:
            x, _ = self.mlp_output_norm(x)
        return x, residual
