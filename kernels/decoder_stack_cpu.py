"""A decode step's decoder layers in one call to the C++ kernels
(kernels/csrc/decoder_stack_cpu.cpp).

Measured on SmolLM2 Q4_1 at batch 1, one thread: of a 12 ms step the kernels took
8.4 ms and Python 3.8 ms, calling them ~10 times a layer through wrappers (views,
dtype checks, argument conversion). The C++ stack calls the same kernels in the same
order on the same tensors, so its results are the layers' to the bit; only the calls
from Python are gone. It runs every query token through decode_attention, as the layers
do for decodes: so it takes steps of decodes and of short chunks (up to SHORT_CHUNK
tokens: a speculative step's drafts to verify, a draft model's catch-up), where the
tiled prefill kernel would save little; longer prompt chunks run layer by layer. In
bf16 only, where every projection is one of our kernels (quantized, or bf16 panels).

It runs Llama's layer (Llama, Mistral, Qwen2, SmolLM2) and the parts Qwen3 and Gemma 2
and 3 add: RMSNorms over each head of q and k before RoPE, RMSNorms on the attention's
and the MLP's outputs, the tanh-GELU gated MLP (torch's gelu and mul, as the layers call
them in bf16), RoPE tables of each layer's own (Gemma 3's sliding layers take a second
base), and attention logit soft-capping (in decode_attention, as the layers'); for the
mixture-of-experts families, OLMoE's q/k norms across all heads and each sparse layer's
C++ expert block (kernels/moe_cpu.py), which the layer calls too. Models with a part it
lacks (an activation other than those, experts the C++ block does not take, a norm or
a field of the layer's description it does not know: the C++ side names them,
``unserved_parts``) run every step layer by layer, and say so once in the log at start.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch
from hetero_infer.kernels.attention_backend import AttentionInputs
from hetero_infer.kernels.decoder_stack import DecoderLayerSpec, DecoderStackFn, DecoderStackSpec
from hetero_infer.kernels.linear import GatedLinear, LinearFn, unfused
from hetero_infer.kernels.linear_choice import KERNEL, ROW_BUCKETS, row_bucket
from hetero_infer.kernels.linear_cpu import KernelLinear, RowSplitLinear
from hetero_infer.kernels.linear_quantized import QuantizedLinear
from hetero_infer.kernels.paged_attention_cpu import CpuAttentionMetadata

logger = logging.getLogger(__name__)

# The longest chunk the stack takes: its tokens' attention reads their context once
# each, where the tiled kernel reads it once per 16 tokens.
SHORT_CHUNK = 8

# A layer's projections, by their DecoderLayerSpec fields
PROJECTIONS = ("qkv", "o", "gate_up", "down")


class CpuDecoderStack:
    # LoRA adapters' updates are applied inside the stack (csrc/lora_cpu.cpp), from the
    # weights set per slot (``set_lora``) to the rows the step gives each slot.
    takes_lora = True

    def __init__(self, stack: object, buckets_served: tuple[bool, ...] | None = None) -> None:
        """``buckets_served``: per bucket of a step's rows (kernels/linear_choice.py),
        whether the stack's projections (ours) are the ones chosen for it (None: all)."""
        self.stack = stack
        self.buckets_served = buckets_served

    def serves(self, meta: AttentionInputs) -> bool:
        if not isinstance(meta, CpuAttentionMetadata) or meta.max_query_len > SHORT_CHUNK:
            return False
        served = self.buckets_served
        return served is None or served[row_bucket(meta.slot_mapping.shape[0])]

    def set_lora(self, layer: int, projection: int, slot: int, weights: object) -> None:
        """An adapter's packed weights (KernelOps.pack_lora) on one projection of a
        layer (0 qkv, 1 o, 2 gate_up, 3 down), in its slot."""
        self.stack.set_lora(layer, projection, slot, weights)

    def remove_lora(self, slot: int) -> None:
        self.stack.remove_lora(slot)

    def __call__(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: CpuAttentionMetadata,
        lora_groups: Sequence[tuple[int, torch.Tensor | None]] = (),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        groups = (meta, *meta.later_groups)
        return self.stack.forward(
            x,
            positions,
            [k for k, _ in kv_caches],
            [v for _, v in kv_caches],
            [group.token_block_tables for group in groups],
            meta.token_context_lens,
            [group.slot_mapping for group in groups],
            [slot for slot, _ in lora_groups],
            [rows for _, rows in lora_groups],
        )


def packed_linear(module: ModuleType, linear: LinearFn) -> object | None:
    """The C++ form of a packed projection, or None where it is not one of our kernels'."""
    # The activation-and-mul after a merged gate_up no kernel fuses (by its HF name)
    then = linear.activation if isinstance(linear, GatedLinear) else ""
    linear = unfused(linear)
    if isinstance(linear, RowSplitLinear):  # the stack runs only the rows ours is chosen for
        linear = linear.kernel
    if isinstance(linear, QuantizedLinear):
        return module.PackedLinear(
            linear.packed, linear.qtype, linear.bias, False, then, linear.activation_bits
        )
    if isinstance(linear, KernelLinear):
        return module.PackedLinear(linear.packed, "", linear.bias, linear.gated, then)
    return None


def pack_decoder_stack(module: ModuleType | None, spec: DecoderStackSpec) -> DecoderStackFn | None:
    """The stack where the extension has it, the model runs in bf16 (the dtype whose
    elementwise ops are the C++ ones: fp32 runs the torch references), every projection
    is ours and the stack computes every part of every layer; else None."""
    if module is None:
        return None
    if any(layer.norms["input"].dtype != torch.bfloat16 for layer in spec.layers):
        return None
    layers = [layer_description(module, layer) for layer in spec.layers]
    if any(layer is None for layer in layers):
        return None
    unserved = _unserved(module, layers)
    if unserved:
        logger.info(
            "the CPU decoder stack does not run %s: decode steps go layer by layer",
            ", ".join(unserved),
        )
        return None
    stack = module.DecoderStack(
        spec.num_heads,
        spec.num_kv_heads,
        spec.head_dim,
        spec.rms_norm_eps,
        spec.scale,
        softcap=spec.attn_logit_softcap or 0.0,
    )
    for layer in layers:
        stack.add_layer(layer)
    return CpuDecoderStack(stack, _buckets_served(spec))


def _buckets_served(spec: DecoderStackSpec) -> tuple[bool, ...] | None:
    """Per bucket of rows, whether ours runs every projection split by rows (None where
    none is split: ours runs them all)."""
    choices = [
        projection.choice
        for layer in spec.layers
        for name in PROJECTIONS
        if isinstance(projection := unfused(getattr(layer, name)), RowSplitLinear)
    ]
    if not choices:
        return None
    return tuple(
        all(choice.kernels[bucket] == KERNEL for choice in choices)
        for bucket in range(len(ROW_BUCKETS) + 1)
    )


def layer_description(module: ModuleType, layer: DecoderLayerSpec) -> dict[str, Any] | None:
    """The layer as the C++ stack reads it: every field of its spec by name, the
    projections and a sparse layer's expert block in their C++ forms (the block None
    where the experts are not the C++ kernel's); None where a projection is not one of
    our kernels'."""
    description = {field.name: getattr(layer, field.name) for field in dataclasses.fields(layer)}
    for name in PROJECTIONS:
        if description[name] is not None:
            description[name] = packed_linear(module, description[name])
            if description[name] is None:
                return None
    # the experts' torch reference (float experts, or kept in a type the C++ block does
    # not take: kernels/moe_cpu.py) has none
    description["moe"] = getattr(layer.moe, "block", None)
    return description


def unserved_parts(module: ModuleType, spec: DecoderStackSpec) -> list[str]:
    """The parts of the model's layers the C++ stack does not compute ([] where it
    computes them all), as it names them."""
    layers = [layer_description(module, layer) for layer in spec.layers]
    return _unserved(module, [layer for layer in layers if layer is not None])


def _unserved(module: ModuleType, layers: list[dict[str, Any]]) -> list[str]:
    return sorted({part for layer in layers for part in module.decoder_layer_unserved(layer)})
