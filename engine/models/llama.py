"""The Llama family (Llama 1-3, SmolLM2, Mistral, Qwen2) over a paged KV cache.

One forward pass serves every scheduled sequence of a step: tokens are packed
into [num_tokens, hidden] and attention finds each token's context through the
block tables in the attention metadata. q/k/v and gate/up projections are merged
into one matmul each. Parameter names follow Hugging Face's, so checkpoints load
by name; ``load_weights`` does the merging, and ``pack_weights`` then prepares each
linear layer's weight for its kernel. The kernels are chosen before the model is built
(kernels.select_kernels) and bound by each layer at construction.

With tensor parallelism each rank builds its share of the layers (models/sharding.py
says which) from a checkpoint cut the same way, and sums the partial
outputs of o_proj and down_proj over the ranks; the embedding and the logits are split
by vocabulary. Without it (``tp`` None) none of that runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hetero_infer.engine.exceptions import ConfigError
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.models.protocol import TensorParallel
from hetero_infer.engine.models.sharding import shard_config
from hetero_infer.kernels import (
    AttentionInputs,
    KernelOps,
    Kernels,
    LinearFn,
    rope_cos_sin,
    rope_inv_freq,
)
from hetero_infer.kernels.decoder_stack import DecoderLayerSpec, DecoderStackSpec
from hetero_infer.kernels.linear import unfused
from hetero_infer.kernels.linear_quantized import DEQUANTIZE_ROWS_TYPES, dequantize_rows
from hetero_infer.kernels.quantized import QuantizedWeight, concat_rows
from torch import nn


class DirectCall:
    """A module whose calls go straight to forward, past nn.Module.__call__'s hook
    handling: the model's inner modules never carry hooks, and a step makes ~300 such
    calls (0.3 ms of a 10 ms batch-1 step on a 2-core CPU, measured). The model itself
    keeps the usual __call__."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)


def _not_packed(x: torch.Tensor) -> torch.Tensor:
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
        self.packed: LinearFn = _not_packed
        self.quantized: QuantizedWeight | None = None

    def keep_quantized(self, weight: QuantizedWeight) -> None:
        self.quantized = weight
        self.weight = nn.Parameter(torch.empty(0, dtype=self.weight.dtype), requires_grad=False)

    def pack_weight(self) -> None:
        weight = self.weight if self.quantized is None else self.quantized
        self.packed = self.pack(weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.packed(x)


class Attention(DirectCall, nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        sliding_window: int | None,
        kernels: Kernels,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
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
        self.scale = self.head_dim**-0.5
        self.sliding_window = sliding_window
        pack = kernels.ops.pack_linear
        qkv_size = self.q_size + 2 * self.kv_size
        self.qkv_proj = Linear(config.hidden_size, qkv_size, config.qkv_bias, pack)
        self.o_proj = Linear(self.q_size, config.hidden_size, config.o_bias, pack)

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
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k, *rope)
        k_cache, v_cache = kv_cache
        self.backend.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = self.backend.forward(q, k_cache, v_cache, meta, self.scale, self.sliding_window)
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
        # Gives silu(gate) * up [num_tokens, intermediate]: SiLU-and-mul is part of the
        # projection, in one pass where a kernel fuses them.
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias, ops.pack_silu_and_mul_linear)
        self.down_proj = Linear(intermediate, hidden, bias, ops.pack_linear)
        if config.hidden_act != "silu":
            raise ConfigError(f"hidden_act {config.hidden_act!r} is not supported (only silu)")

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


class DecoderLayer(DirectCall, nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        sliding_window: int | None,
        kernels: Kernels,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        ops = kernels.ops
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.self_attn = Attention(config, sliding_window, kernels, all_reduce)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.mlp = MLP(config, ops, all_reduce)

    def forward(self, x, residual, positions, rope, kv_cache, meta):
        x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, positions, rope, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    """A CausalLM (models/protocol.py); with ``tp``, one rank's share of it."""

    def __init__(
        self, config: ModelConfig, kernels: Kernels, tp: TensorParallel | None = None
    ) -> None:
        super().__init__()
        self.config = config
        self.kernels = kernels
        self.tp = tp
        self.vocab_size = config.vocab_size
        # This rank's shapes: its heads, MLP columns and vocabulary rows.
        local = config if tp is None else shard_config(config, tp.world_size)
        all_reduce = None if tp is None else tp.all_reduce
        self.num_layers = config.num_layers
        self.num_kv_heads = local.num_kv_heads
        self.head_dim = config.head_dim
        self.sliding_windows = set(config.sliding_windows)
        self.embed_tokens = nn.Embedding(local.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(local, w, kernels, all_reduce) for w in config.sliding_windows
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels.ops)
        self.tie_word_embeddings = config.tie_word_embeddings
        self.lm_head = None
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, local.vocab_size, bias=False)
        self.rope_cos = self.rope_sin = None
        self.logits_proj: LinearFn = _not_packed
        # The embedding's quantized blocks, where the checkpoint's are kept: rows are
        # dequantized as tokens look them up.
        self.embed_quantized: QuantizedWeight | None = None

    def init_rope(self, device: torch.device) -> None:
        """Build the cos/sin tables (kept outside the parameters, which load from a checkpoint)."""
        config = self.config
        inv_freq = rope_inv_freq(self.head_dim, config.rope_theta, config.rope_scaling)
        cos, sin = rope_cos_sin(inv_freq, config.max_position_embeddings)
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionInputs,
    ) -> torch.Tensor:
        """input_ids, positions [num_tokens] -> final hidden states [num_tokens, hidden]."""
        x = self.embed(input_ids)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, positions, self.rope, kv_cache, meta)
        return self.final_norm(x, residual)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [num_tokens] -> the embeddings [num_tokens, hidden]."""
        if self.tp is not None:
            return self._embed_vocab_shard(input_ids, self.tp)
        if self.embed_quantized is None:
            return self.embed_tokens(input_ids)
        return dequantize_rows(self.embed_quantized, input_ids, self.norm.weight.dtype)

    @property
    def rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The RoPE tables (cos, sin) the layers take."""
        return self.rope_cos, self.rope_sin

    def final_norm(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The last layer's output and the residual stream -> the final hidden states."""
        x, _ = self.norm(x, residual)
        return x

    def _embed_vocab_shard(self, input_ids: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        """The embedding of tokens in this rank's vocabulary rows, zeros for the others,
        summed over the ranks: each token's row, exactly."""
        rows = self.embed_tokens.weight.shape[0]
        local_ids = input_ids - tp.rank * rows
        outside = (local_ids < 0) | (local_ids >= rows)
        x = self.embed_tokens(local_ids.masked_fill(outside, 0))  # [num_tokens, hidden]
        return tp.all_reduce(x.masked_fill_(outside[:, None], 0))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden] -> logits [n, vocab] in the model's dtype (the sampler
        converts to fp32 where it needs to: the greedy pick reads them as they are).
        With tensor parallelism every rank calls it together and gets them all."""
        logits = self.logits_proj(hidden)
        if self.tp is None:
            return logits
        logits = self.tp.all_gather(logits)  # [n, padded vocab]
        if logits.shape[-1] != self.vocab_size:
            logits = logits[:, : self.vocab_size].contiguous()  # the padding rows' zeros
        return logits

    @torch.no_grad()
    def pack_weights(self, place: Callable[[list[Any]], None] | None = None) -> None:
        """Prepare every linear layer's weight for its kernel, once, after load_weights
        (on the CPU: packed bf16 copies). A weight changed afterwards needs this again.
        ``place``: the loader's placement of the packed weights in the order a step
        reads them (on the CPU, one buffer on huge pages)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack_weight()
        if self.lm_head is not None:
            weight = self.lm_head.weight
        else:
            weight = self.embed_quantized or self.embed_tokens.weight
        self.logits_proj = self.kernels.ops.pack_linear(weight, None)
        if place is not None:
            place(self.packed_in_step_order())

    def packed_in_step_order(self) -> list[Any]:
        """The projections whose packed weight is a plain tensor, in the order a step
        reads them."""
        projections = [
            unfused(linear.packed)
            for layer in self.layers
            for linear in (
                layer.self_attn.qkv_proj,
                layer.self_attn.o_proj,
                layer.mlp.gate_up_proj,
                layer.mlp.down_proj,
            )
        ]
        return [
            projection
            for projection in [*projections, self.logits_proj]
            if isinstance(packed := getattr(projection, "packed", None), torch.Tensor)
            and packed.layout == torch.strided
        ]

    def decoder_stack_spec(self) -> DecoderStackSpec:
        """The layers' packed weights, as the kernels' one-call stack takes them."""
        attention = self.layers[0].self_attn
        layers = tuple(
            DecoderLayerSpec(
                input_norm=layer.input_layernorm.weight,
                post_attention_norm=layer.post_attention_layernorm.weight,
                qkv=layer.self_attn.qkv_proj.packed,
                o=layer.self_attn.o_proj.packed,
                gate_up=layer.mlp.gate_up_proj.packed,
                down=layer.mlp.down_proj.packed,
                sliding_window=layer.self_attn.sliding_window,
            )
            for layer in self.layers
        )
        return DecoderStackSpec(
            num_heads=attention.num_heads,
            num_kv_heads=attention.num_kv_heads,
            head_dim=attention.head_dim,
            rms_norm_eps=self.config.rms_norm_eps,
            scale=attention.scale,
            layers=layers,
        )

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor | QuantizedWeight]) -> None:
        """Load Hugging Face-named tensors, merging q/k/v and gate/up. A quantized
        weight stays quantized where the kernels take it (and the embedding, whose rows
        are dequantized per lookup), and is dequantized to the model's dtype otherwise."""
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        loaded: set[str] = set()

        def put(name: str, tensor: torch.Tensor | QuantizedWeight) -> None:
            if name not in params:
                raise ConfigError(f"checkpoint tensor for unknown parameter {name!r}")
            if params[name].shape != tensor.shape:
                raise ConfigError(
                    f"{name}: checkpoint shape {tuple(tensor.shape)} does not match the "
                    f"model's {tuple(params[name].shape)}"
                )
            loaded.add(name)
            if isinstance(tensor, QuantizedWeight):
                owner = modules[name.removesuffix(".weight")]
                # The kernels are asked about the blocks on the model's device, where they
                # would read them (a GPU kernel takes none left on the CPU); a weight
                # none takes is dequantized from the loader's copy.
                placed = quantized_on(tensor, params[name].device)
                takes = self.kernels.ops.takes_quantized(placed)
                if isinstance(owner, Linear) and takes:
                    return owner.keep_quantized(placed)
                # Kept only where the kernels take it too (as the tied lm_head, and on
                # the device the lookups run on).
                if (
                    name == "embed_tokens.weight"
                    and takes
                    and tensor.qtype in DEQUANTIZE_ROWS_TYPES
                ):
                    self.embed_quantized = placed
                    self.embed_tokens.weight = nn.Parameter(torch.empty(0), requires_grad=False)
                    return
                tensor = tensor.dequantize(params[name].dtype)
            params[name].copy_(tensor)

        merged: dict[str, dict[str, torch.Tensor | QuantizedWeight]] = {}
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
            put(name, merge_rows([parts[i] for i in sorted(parts)], params[name].dtype))
        missing = set(params) - loaded
        if missing:
            raise ConfigError(f"checkpoint is missing parameters: {sorted(missing)[:5]}")


def quantized_on(weight: QuantizedWeight, device: torch.device) -> QuantizedWeight:
    """The weight with its blocks (and scales) on ``device``."""
    if weight.data.device == device:
        return weight
    scales = None if weight.scales is None else weight.scales.to(device)
    return QuantizedWeight(weight.qtype, weight.data.to(device), weight.shape, scales)


def merge_rows(
    parts: list[torch.Tensor | QuantizedWeight], dtype: torch.dtype
) -> torch.Tensor | QuantizedWeight:
    """Weights stacked along their output rows: quantized where all parts are of one
    quantized type, else dequantized to ``dtype``."""
    if all(isinstance(p, QuantizedWeight) for p in parts):
        merged = concat_rows(parts)
        if merged is not None:
            return merged
    return torch.cat([p.dequantize(dtype) if isinstance(p, QuantizedWeight) else p for p in parts])
