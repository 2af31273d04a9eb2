"""A model's decoder layers handed to the kernels whole, for steps they can run in one call.

At batch 1 on a 2-core CPU the layers' kernels take about two thirds of a decode step;
the rest went to Python calling them, ~10 calls a layer. ``KernelOps.pack_decoder_stack``
takes the layers' packed weights and RoPE tables once (``DecoderStackSpec``, built by
the model after packing) and gives a ``DecoderStackFn`` where the device's kernels have
one (the CPU's: kernels/decoder_stack_cpu.py), or None. The model runs a step through it
where it ``serves`` the step's metadata, and layer by layer otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from hetero_infer.kernels.attention_backend import AttentionInputs
from hetero_infer.kernels.linear import LinearFn


@dataclass(frozen=True)
class DecoderLayerSpec:
    """One decoder layer: pre-norm attention (merged qkv, RoPE, paged KV), then a
    pre-norm gated MLP, each added to the residual stream; the parts past Llama's are
    set where the model has them (engine/models/layers.py). The one description of a
    layer the kernels take: the C++ stack reads it field by field, by name, and names
    what it does not compute (kernels/csrc/bindings.cpp)."""

    # The layer's RMSNorm weights by their place: "input" and "post_attention" in every
    # layer; "q" and "k" over each head of q and k before RoPE (Qwen3, Gemma 3), or over
    # all heads at once where qk_norm_across_heads (OLMoE); "attn_output" and
    # "mlp_output" on the attention's and the MLP's outputs (Gemma)
    norms: Mapping[str, torch.Tensor]
    qkv: LinearFn  # -> [tokens, q + 2 * kv]
    o: LinearFn
    gate_up: LinearFn | None  # -> activation(gate) * up; None in a sparse layer
    down: LinearFn | None
    sliding_window: int | None
    # This layer's KV cache group: the step's block tables and slots it reads
    # (AttentionInputs.for_group)
    kv_group: int
    # This layer's RoPE tables (cos, sin), fp32 [max_positions, head_dim]: the global
    # ones, or a sliding-window layer's own (Gemma 3's second base)
    rope: tuple[torch.Tensor, torch.Tensor]
    activation: str = "silu"  # the HF name: "silu", "gelu_pytorch_tanh"
    # The q and k norms span all heads (OLMoE) rather than each head
    qk_norm_across_heads: bool = False
    # A sparse layer's mixture-of-experts block as the kernels packed it
    # (KernelOps.pack_moe), or None where none did; gate_up and down are None in a
    # sparse layer
    moe: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass(frozen=True)
class DecoderStackSpec:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    scale: float  # attention's softmax scale
    layers: tuple[DecoderLayerSpec, ...]
    # tanh soft-capping of the attention's logits at this value (Gemma 2), or None
    attn_logit_softcap: float | None = None


class DecoderStackFn(Protocol):
    def serves(self, meta: AttentionInputs) -> bool:
        """Whether this step can run through the stack."""
        ...

    def __call__(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionInputs,
        lora_groups: Sequence[tuple[int, torch.Tensor | None]] = (),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [tokens, hidden] embedded -> (last layer's output, residual stream), what
        the layers one by one give (each with its RoPE tables, from the spec).
        ``lora_groups``: the step's rows by LoRA slot (a stack whose ``takes_lora``
        applies the adapters set with ``set_lora``)."""
        ...


def no_decoder_stack(spec: DecoderStackSpec) -> DecoderStackFn | None:
    return None
