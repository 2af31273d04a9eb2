"""GGUF files: their tensors under Hugging Face names (dequantized, or kept in their
quantized blocks); their metadata's conversion is gguf_metadata.py's."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hetero_infer.engine.loader.gguf_header import read_gguf_header
from hetero_infer.engine.models.architectures import (
    BY_GGUF_ARCH,
    BY_GGUF_MOE_ARCH,
    GEMMA_NORMS,
    Family,
)
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import GGUF_TYPES, QuantizedWeight, dequantize_weight

logger = logging.getLogger(__name__)

# GGUF tensor name -> HF parameter name. Layer tensors are "blk.{i}.{part}.{weight|bias}".
GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER_PARTS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
GGUF_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# Gemma's norms, under its HF names (decoder_weights.py renames them as it does its
# safetensors'): llama.cpp's ffn_norm is the one before the MLP there too.
GGUF_GEMMA_NORMS = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
assert set(GEMMA_NORMS) == set(GGUF_GEMMA_NORMS.values())
# Mixture-of-experts layers: the router, the experts' merged tensors [experts, out, in]
# (split per expert at load, under HF's per-expert names), and Qwen2-MoE's shared
# expert with its sigmoid gate (a [hidden] vector in the file, [1, hidden] in HF's).
GGUF_MOE_PARTS = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
GGUF_EXPERT_PARTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
# Fused projections (Phi-3's), under the names their HF checkpoints give them.
GGUF_FUSED_PARTS = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
GGUF_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Llama-3 GGUFs store precomputed RoPE frequency factors (we derive them from the
# config), Phi-3's its LongRoPE factors (read into the config: gguf_rope.py).
GGUF_SKIPPED = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def gguf_layer_parts(family: Family) -> dict[str, str]:
    """llama.cpp's names of a family's layer tensors -> the HF checkpoint's."""
    parts = dict(GGUF_LAYER_PARTS)
    if family.qk_norm:
        parts |= GGUF_QK_NORMS
    if family.gemma:
        parts |= GGUF_GEMMA_NORMS
    if family.fused_projections:
        parts |= GGUF_FUSED_PARTS
    if family.mixture_of_experts:
        parts |= GGUF_MOE_PARTS
    return parts


def gguf_hf_name(name: str, parts: dict[str, str] = GGUF_LAYER_PARTS) -> str | None:
    """HF parameter name for a GGUF tensor name (``parts``: the family's layer parts);
    None for tensors we recompute."""
    if name in GGUF_GLOBAL_NAMES:
        return GGUF_GLOBAL_NAMES[name]
    if name in GGUF_SKIPPED:
        return None
    match = GGUF_LAYER_RE.fullmatch(name)
    if match is None or match.group(2) not in parts:
        raise ConfigError(f"unexpected GGUF tensor {name!r}")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{parts[part]}.{kind}"


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k permute: it regroups each head's rows from HF's
    [first half | second half] RoPE layout into interleaved pairs.

    The converter does reshape(n_head, 2, d/2, ...).swapaxes(1, 2); this swaps back.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(
    path: Path, dtype: torch.dtype, keep_quantized: bool = False
) -> dict[str, torch.Tensor | QuantizedWeight]:
    """Every tensor of a GGUF file, q/k rows back in HF's order: dequantized to `dtype`,
    or with ``keep_quantized`` the 2-D tensors of a type in GGUF_TYPES as they are
    stored (QuantizedWeight; their rows are independent, so the q/k rows are reordered
    as bytes)."""
    import gguf

    header = read_gguf_header(path)
    arch = header.fields.get("general.architecture")
    n_head = header.fields.get(f"{arch}.attention.head_count")
    n_kv_head = header.fields.get(f"{arch}.attention.head_count_kv") or n_head
    family = BY_GGUF_ARCH.get(arch)
    if family is not None and header.fields.get(f"{arch}.expert_count"):
        family = BY_GGUF_MOE_ARCH.get(arch, family)  # llama.cpp files Mixtral as "llama"
    if family is None:
        supported = ", ".join(BY_GGUF_ARCH)
        raise ConfigError(f"{path}: GGUF architecture {arch!r} is not supported ({supported})")
    permuted = family.gguf_permuted_qk
    if permuted and n_head is None:
        raise ConfigError(f"{path}: GGUF file has no {arch}.attention.head_count")
    parts = gguf_layer_parts(family)

    state_dict: dict[str, torch.Tensor | QuantizedWeight] = {}
    for tensor in header.tensors:
        hf_name = gguf_hf_name(tensor.name, parts)
        if hf_name is None:
            continue
        # GGUF lists dims fastest-first; torch wants them slowest-first.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        heads = None
        if permuted and ".attn_q." in tensor.name:
            heads = n_head
        elif permuted and ".attn_k." in tensor.name:
            heads = n_kv_head
        qtype = tensor.tensor_type.name
        if len(shape) == 3 and tensor.name.split(".")[2] in GGUF_EXPERT_PARTS:
            state_dict |= expert_tensors(tensor, hf_name, shape, dtype, keep_quantized)
            continue
        if qtype in GGUF_TYPES and len(shape) == 2:
            # A copy: the header's arrays are views into the read-only memory map.
            blocks = torch.from_numpy(np.array(tensor.data, dtype=np.uint8))
            weight = QuantizedWeight(qtype, blocks, shape)
            if heads is not None:
                weight = weight.rows(torch.from_numpy(unpermute_rows(np.arange(shape[0]), heads)))
            if keep_quantized:
                state_dict[hf_name] = weight
                continue
            weights = dequantize_weight(weight, torch.float32).numpy()
        else:
            weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
            if heads is not None:
                weights = unpermute_rows(weights, heads)
        if not weights.flags.writeable:
            # F32 tensors are views into the read-only memory map.
            weights = weights.copy()
        if hf_name.endswith("shared_expert_gate.weight"):
            weights = weights.reshape(1, -1)
        if family.gemma and hf_name.endswith("norm.weight"):
            # llama.cpp's converter stores Gemma's norms as (1 + w); the HF checkpoint,
            # and so the model's loader, has w (transformers subtracts it too).
            weights = weights - 1
        state_dict[hf_name] = torch.from_numpy(weights).to(dtype)
    logger.debug("GGUF %s: arch %s, %d heads, %d kv heads", path, arch, n_head, n_kv_head)
    return state_dict


def expert_tensors(
    tensor: Any, hf_name: str, shape: tuple[int, ...], dtype: torch.dtype, keep_quantized: bool
) -> dict[str, torch.Tensor | QuantizedWeight]:
    """A merged expert tensor [experts, out, in] as one tensor per expert, under HF's
    per-expert names ("mlp.experts.gate_proj" -> "mlp.experts.{e}.gate_proj"):
    quantized blocks kept (each expert's rows are whole rows of blocks), or dequantized
    to ``dtype``."""
    import gguf

    experts, rows = shape[0], shape[1]
    base = hf_name.removesuffix(".weight")
    names = [base.replace(".experts.", f".experts.{e}.") + ".weight" for e in range(experts)]
    qtype = tensor.tensor_type.name
    if keep_quantized and qtype in GGUF_TYPES:
        blocks = torch.from_numpy(np.array(tensor.data, dtype=np.uint8)).reshape(experts, rows, -1)
        return {
            name: QuantizedWeight(qtype, blocks[e], (rows, shape[2]))
            for e, name in enumerate(names)
        }
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
    stacked = torch.from_numpy(np.array(values)).to(dtype)
    return {name: stacked[e] for e, name in enumerate(names)}
