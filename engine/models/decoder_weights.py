"""How a Hugging Face checkpoint's tensors land in DecoderForCausalLM: by name (other
families' names renamed to Llama's: architectures.py), with q/k/v and gate/up merged
into one projection each, RMSNorm weights stored as (weight - offset) restored, q/k
rows reordered where RoPE rotates part of each head, and quantized weights kept
quantized where the kernels take them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Protocol

import torch
from hetero_infer.engine.models.architectures import BY_ARCHITECTURE
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.models.layers import Linear, RMSNorm
from hetero_infer.engine.models.moe import Experts
from hetero_infer.engine.models.moe_weights import gather_experts
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import (
    DEQUANTIZE_ROWS_TYPES,
    Kernels,
    QuantizedWeight,
    concat_rows,
    partial_rotary_order,
)
from torch import nn


class DecoderToLoad(Protocol):
    """What loading reads and sets of a decoder (decoder.py's DecoderForCausalLM, which
    loads itself with load_decoder_weights): its parameters and modules by name, and
    the parts where a checkpoint's quantized blocks may be kept as they are."""

    config: ModelConfig
    kernels: Kernels
    layers: nn.ModuleList
    norm: RMSNorm
    embed_tokens: nn.Embedding
    lm_head: nn.Linear | None
    embed_quantized: QuantizedWeight | None
    lm_head_quantized: QuantizedWeight | None
    # The prefixes of parameters that load on their own (a vision tower's), not here.
    loaded_apart: tuple[str, ...]

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]: ...

    def named_modules(self) -> Iterator[tuple[str, nn.Module]]: ...


@torch.no_grad()
def load_decoder_weights(
    model: DecoderToLoad, state_dict: dict[str, torch.Tensor | QuantizedWeight]
) -> None:
    """Load Hugging Face-named tensors, merging q/k/v and gate/up. A quantized
    weight stays quantized where the kernels take it (and the embedding, whose rows
    are dequantized per lookup), and is dequantized to the model's dtype otherwise."""
    params = {
        name: param
        for name, param in model.named_parameters()
        if not name.startswith(model.loaded_apart)
    }
    modules = dict(model.named_modules())
    renames = BY_ARCHITECTURE[model.config.architecture].renames
    norm_offset = model.config.norm_weight_offset
    qkv_order = partial_rotary_qkv_order(model)
    loaded: set[str] = set()

    def put(name: str, tensor: torch.Tensor | QuantizedWeight | list[QuantizedWeight]) -> None:
        owner_name, _, projection = name.rpartition(".")
        if isinstance(modules.get(owner_name), Experts):  # stacks, or a weight per expert
            return load_experts(modules[owner_name], name, projection, tensor)
        if name not in params:
            raise ConfigError(f"checkpoint tensor for unknown parameter {name!r}")
        if qkv_order is not None and ".qkv_proj." in name:  # its weight and bias
            is_quantized = isinstance(tensor, QuantizedWeight)
            tensor = tensor.rows(qkv_order) if is_quantized else tensor[qkv_order]
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
            # none takes is dequantized from the loader's copy. The projections'
            # activations are rounded to the family's precision (its outlier channels);
            # the tied lm_head's (the embedding's blocks) to int8, whatever the
            # family: Gemma-3-270M's is 2.4x its MLP's products, and 16 bits there
            # moved its teacher-forced logprobs by 0.041 (rms), int8 by 0.049.
            placed = quantized_on(tensor, params[name].device)
            if isinstance(owner, Linear):
                bits = model.config.quantized_activation_bits
                placed = replace(placed, activation_bits=bits)
            takes = model.kernels.ops.takes_quantized(placed)
            if isinstance(owner, Linear) and takes:
                return owner.keep_quantized(placed)
            # An untied lm_head (OLMoE's, Mixtral's files) as the logits' projection.
            if name == "lm_head.weight" and takes:
                model.lm_head_quantized = placed
                model.lm_head.weight = nn.Parameter(torch.empty(0), requires_grad=False)
                return
            # Kept only where the kernels take it too (as the tied lm_head, and on
            # the device the lookups run on).
            if name == "embed_tokens.weight" and takes and tensor.qtype in DEQUANTIZE_ROWS_TYPES:
                model.embed_quantized = placed
                model.embed_tokens.weight = nn.Parameter(torch.empty(0), requires_grad=False)
                return
            tensor = tensor.dequantize(params[name].dtype)
        if norm_offset and isinstance(modules[name.rsplit(".", 1)[0]], RMSNorm):
            # In fp32, as the family's own norm adds it (Gemma: x_normed * (1 + w)).
            tensor = tensor.float() + norm_offset
        params[name].copy_(tensor)

    def load_experts(
        experts: Experts, name: str, projection: str, weights: torch.Tensor | list
    ) -> None:
        loaded.add(name)
        if isinstance(weights, list):
            weights = [
                replace(
                    quantized_on(w, experts.gate_up_proj.device),
                    activation_bits=model.config.quantized_activation_bits,
                )
                for w in weights
            ]
        experts.load(projection, weights)

    renamed = {}
    for name, tensor in state_dict.items():
        name = ".".join(renames.get(part, part) for part in name.removeprefix("model.").split("."))
        if "rotary_emb" in name:
            continue
        if name == "lm_head.weight" and model.lm_head is None:
            continue  # tied to the embedding
        renamed[name] = tensor
    merged: dict[str, dict[str, torch.Tensor | QuantizedWeight]] = {}
    for name, tensor in gather_experts(renamed, model.norm.weight.dtype).items():
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
    for module in modules.values():
        if isinstance(module, Experts):
            module.finish_loading()
    missing = set(params) - loaded
    if missing:
        raise ConfigError(f"checkpoint is missing parameters: {sorted(missing)[:5]}")


def partial_rotary_qkv_order(model: DecoderToLoad) -> torch.Tensor | None:
    """The merged q/k/v rows in the order the kernels rotate them (kernels/rotary.py's
    partial_rotary_order for each q and k head of this rank; v as it is), where RoPE
    rotates part of each head; else None."""
    config = model.config
    if config.rotary_dim is None:
        return None
    attention = model.layers[0].self_attn
    head_dim = attention.head_dim
    order = partial_rotary_order(head_dim, config.rotary_dim)

    def heads(count: int, start: int) -> torch.Tensor:
        return (start + torch.arange(count)[:, None] * head_dim + order).flatten()

    q_size, kv_size = attention.q_size, attention.kv_size
    return torch.cat(
        [
            heads(attention.num_heads, 0),
            heads(attention.num_kv_heads, q_size),
            torch.arange(q_size + kv_size, q_size + 2 * kv_size),
        ]
    )


def quantized_on(weight: QuantizedWeight, device: torch.device) -> QuantizedWeight:
    """The weight with its blocks (and scales) on ``device``."""
    if weight.data.device == device:
        return weight
    scales = None if weight.scales is None else weight.scales.to(device)
    return replace(weight, data=weight.data.to(device), scales=scales)


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
