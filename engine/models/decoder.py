"""The decoder every supported family runs (architectures.py: Llama 1-3, SmolLM2,
Mistral, Qwen2 and 3, Gemma 2 and 3, Phi-3) over a paged KV cache.

One forward pass serves every scheduled sequence of a step: tokens are packed
into [num_tokens, hidden] and attention finds each token's context through the
block tables in the attention metadata. The layers are in layers.py, each with the
parts its family has. Parameter names follow Hugging Face's Llama, so checkpoints load
by name (decoder_weights.py, which renames other families' tensors), and
``pack_weights`` then prepares each linear layer's weight for its kernel. The kernels
are chosen before the model is built (kernels.select_kernels) and bound by each layer
at construction.

With tensor parallelism each rank builds its share of the layers (models/sharding.py
says which) from a checkpoint cut the same way, and sums the partial
outputs of o_proj and down_proj over the ranks; the embedding and the logits are split
by vocabulary. Without it (``tp`` None) none of that runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.models.decoder_weights import load_decoder_weights
from hetero_infer.engine.models.layers import (
    MLP,
    DecoderLayer,
    Linear,
    RMSNorm,
    not_packed,
    pack_linears,
)
from hetero_infer.engine.models.moe import SparseMoe
from hetero_infer.engine.models.mrope import mrope_rows
from hetero_infer.engine.models.protocol import ImageEmbeds, TensorParallel
from hetero_infer.engine.models.sharding import shard_config
from hetero_infer.kernels import (
    AttentionInputs,
    DecoderLayerSpec,
    DecoderStackSpec,
    Kernels,
    LinearFn,
    PlanarWeight,
    QuantizedWeight,
    dequantize_rows,
    rope_tables,
    unfused,
)
from torch import nn


class DecoderForCausalLM(nn.Module):
    """A CausalLM (models/protocol.py); with ``tp``, one rank's share of it."""

    # The prefixes of parameters that load on their own (load_decoder_weights skips
    # them): a vision-language model's vision side.
    loaded_apart: tuple[str, ...] = ()

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
        # Given its (empty) weight: nn.Embedding's own random init, on the meta device the
        # model is built on, would import torch._dynamo, and Triton with it, for nothing.
        self.embed_tokens = nn.Embedding(
            local.vocab_size,
            config.hidden_size,
            _weight=torch.empty(local.vocab_size, config.hidden_size),
        )
        sparse = config.moe.sparse_layers if config.moe else (False,) * config.num_layers
        self.layers = nn.ModuleList(
            DecoderLayer(
                local, i, kernels, all_reduce, SparseMoe(local, kernels.ops) if moe else None
            )
            for i, moe in enumerate(sparse)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels.ops)
        self.tie_word_embeddings = config.tie_word_embeddings
        self.lm_head = None
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, local.vocab_size, bias=False)
        self.embedding_multiplier = config.embedding_multiplier
        self.final_logit_softcap = config.final_logit_softcap
        # LongRoPE (Phi-3): the context past which a sequence takes the long factors,
        # else None. Their tables are the second half of the RoPE tables: the runner
        # gives such a sequence's tokens those rows (worker/input_batch.py), and the
        # scheduler restarts one that crosses it with its keys rotated the short way.
        scaling = config.rope_scaling or {}
        self.long_rope_after = None
        if scaling.get("rope_type") == "longrope":
            self.long_rope_after = scaling["original_max_position_embeddings"]
        # (cos, sin) per layer: the global layers' tables, or the sliding layers' own
        self.layer_ropes: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.logits_proj: LinearFn = not_packed
        # The embedding's quantized blocks, where the checkpoint's are kept: rows are
        # dequantized as tokens look them up.
        self.embed_quantized: QuantizedWeight | PlanarWeight | None = None
        # An untied lm_head's quantized blocks, where the checkpoint's are kept.
        self.lm_head_quantized: QuantizedWeight | PlanarWeight | None = None

    def init_rope(self, device: torch.device) -> None:
        """Build the cos/sin tables (kept outside the parameters, which load from a
        checkpoint): one set, or with a sliding-window base of its own a second set for
        those layers."""
        config = self.config

        def tables(theta: float, scaling: dict[str, Any] | None) -> tuple[torch.Tensor, ...]:
            cos, sin = rope_tables(
                self.head_dim, theta, scaling, config.max_position_embeddings, config.rotary_dim
            )
            return cos.to(device), sin.to(device)

        full = tables(config.rope_theta, config.rope_scaling)
        sliding = full
        if config.sliding_rope_theta is not None:
            sliding = tables(config.sliding_rope_theta, None)
        self.layer_ropes = [full if w is None else sliding for w in config.sliding_windows]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionInputs,
        image_embeds: ImageEmbeds | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [num_tokens] -> final hidden states [num_tokens, hidden].
        M-RoPE's steps with image tokens give positions [3, num_tokens] (models/mrope.py)."""
        x = self.embed(input_ids, image_embeds)
        residual = None
        layer_ropes = self.layer_ropes
        if positions.dim() == 2:  # each token's tables' rows, then token i at row i
            rope = mrope_rows(layer_ropes[0], positions, self.config.mrope_section)
            layer_ropes = [rope] * len(layer_ropes)
            positions = torch.arange(positions.shape[1], device=positions.device)
        for layer, kv_cache, rope in zip(self.layers, kv_caches, layer_ropes, strict=True):
            x, residual = layer(x, residual, positions, rope, kv_cache, meta)
        return self.final_norm(x, residual)

    def embed(
        self, input_ids: torch.Tensor, image_embeds: ImageEmbeds | None = None
    ) -> torch.Tensor:
        """input_ids [num_tokens] -> the embeddings [num_tokens, hidden] (times the
        family's multiplier, in the model's dtype as transformers does); the rows
        ``image_embeds`` names replaced by its images' embeddings, as they are."""
        if self.tp is not None:
            x = self._embed_vocab_shard(input_ids, self.tp)
        elif self.embed_quantized is None:
            x = self.embed_tokens(input_ids)
        else:
            x = dequantize_rows(self.embed_quantized, input_ids, self.norm.weight.dtype)
        if self.embedding_multiplier != 1.0:
            x = x * torch.tensor(self.embedding_multiplier, dtype=x.dtype)
        if image_embeds is not None:
            rows, embeddings = image_embeds
            x = x.index_copy(0, rows, embeddings.to(x.dtype))
        return x

    def encode_images(self, pixel_values: list[torch.Tensor]) -> torch.Tensor:
        """A text model takes no images (a vision model's class overrides this)."""
        raise TypeError(f"{self.config.architecture} takes no images")

    def is_vision_weight(self, name: str) -> bool:
        """Whether a checkpoint tensor is a vision model's vision side (kept whole on every
        rank under tensor parallelism); a text model has none."""
        return False

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
        converts to fp32 where it needs to: the greedy pick reads them as they are),
        soft-capped where the family does (Gemma 2: in the model's dtype too, as
        transformers does). With tensor parallelism every rank calls it together and
        gets them all."""
        logits = self.logits_proj(hidden)
        if self.tp is not None:
            logits = self.tp.all_gather(logits)  # [n, padded vocab]
            if logits.shape[-1] != self.vocab_size:
                logits = logits[:, : self.vocab_size].contiguous()  # the padding rows' zeros
        if self.final_logit_softcap is not None:
            cap = self.final_logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.no_grad()
    def pack_weights(self, place: Callable[[list[Any]], None] | None = None) -> None:
        """Prepare every linear layer's weight for its kernel, once, after load_weights
        (on the CPU: packed bf16 copies). A weight changed afterwards needs this again.
        ``place``: the loader's placement of the packed weights in the order a step
        reads them (on the CPU, one buffer on huge pages)."""
        # A part loaded apart packs its own as it loads (vision_weights.py).
        pack_linears(self, skip=self.loaded_apart)
        for module in self.modules():  # after their router's and shared expert's Linears
            if isinstance(module, SparseMoe):
                module.pack_weights(self.kernels.ops)
        if self.lm_head is not None:
            weight = self.lm_head_quantized or self.lm_head.weight
        else:
            weight = self.embed_quantized or self.embed_tokens.weight
        self.logits_proj = self.kernels.ops.pack_linear(weight, None)
        # Repacked by the kernel (the GPU's planes): its copy is the only one, lookups too.
        if (repacked := getattr(self.logits_proj, "repacked_weight", None)) is not None:
            if self.lm_head is not None:
                self.lm_head_quantized = repacked
            else:
                self.embed_quantized = repacked
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
                *_mlp_projections(layer.mlp),
            )
        ]
        return [
            projection
            for projection in [*projections, self.logits_proj]
            if isinstance(packed := getattr(projection, "packed", None), torch.Tensor)
            and packed.layout == torch.strided
        ]

    def decoder_stack_spec(self) -> DecoderStackSpec:
        """The layers' packed weights and RoPE tables (after init_rope), as the kernels'
        one-call stack takes them."""
        attention = self.layers[0].self_attn
        layers = tuple(
            DecoderLayerSpec(
                norms=layer.norms(),
                qkv=layer.self_attn.qkv_proj.packed,
                o=layer.self_attn.o_proj.packed,
                gate_up=layer.mlp.gate_up_proj.packed if isinstance(layer.mlp, MLP) else None,
                down=layer.mlp.down_proj.packed if isinstance(layer.mlp, MLP) else None,
                moe=None if isinstance(layer.mlp, MLP) else layer.mlp.fused,
                qk_norm_across_heads=self.config.qk_norm_across_heads,
                sliding_window=layer.self_attn.sliding_window,
                kv_group=layer.self_attn.kv_group,
                rope=rope,
                activation=self.config.hidden_act,
            )
            for layer, rope in zip(self.layers, self.layer_ropes, strict=True)
        )
        return DecoderStackSpec(
            num_heads=attention.num_heads,
            num_kv_heads=attention.num_kv_heads,
            head_dim=attention.head_dim,
            rms_norm_eps=self.config.rms_norm_eps,
            scale=attention.scale,
            layers=layers,
            attn_logit_softcap=attention.softcap,
        )

    def load_weights(self, state_dict: dict[str, torch.Tensor | QuantizedWeight]) -> None:
        """Load Hugging Face-named tensors (decoder_weights.py)."""
        load_decoder_weights(self, state_dict)


def _mlp_projections(mlp: MLP | SparseMoe) -> list[Linear]:
    """The dense projections of a layer's MLP, or of a sparse layer's router and shared
    expert (the routed experts' weights are the kernel's own)."""
    if isinstance(mlp, MLP):
        return [mlp.gate_up_proj, mlp.down_proj]
    shared = mlp.shared_expert
    extra = (
        [] if shared is None else [shared.gate_up_proj, shared.down_proj, mlp.shared_expert_gate]
    )
    return [mlp.gate, *extra]
