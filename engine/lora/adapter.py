"""A LoRA adapter in PEFT's layout, read and checked against the model it is for.

PEFT saves an adapter as ``adapter_config.json`` (its rank ``r``, ``lora_alpha``,
``use_rslora``, the base model it was trained on) and ``adapter_model.safetensors``,
where each adapted projection has ``...layers.{i}.self_attn.q_proj.lora_A.weight``
[r, in] and ``...lora_B.weight`` [out, r]. Its effect on a projection is
``x @ (W + scaling * B @ A)^T``, scaling = alpha / r (alpha / sqrt(r) with rsLoRA).

Everything that could make the adapter's output wrong is refused here, before any of
it reaches the model, with a message that names the problem (a 400 on the server): a
missing file, a kind of adapter other than plain LoRA (DoRA, biases, modules saved
whole, per-module rank or alpha patterns), modules other than q/k/v/o and gate/up/down,
a rank above max_lora_rank, and tensors whose shapes or layers do not fit this model
(an adapter built for another base model).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.settings.exceptions import ValidationError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The projections an adapter may change, and the model's merged projection each is part
# of (engine/models/layers.py merges q/k/v and gate/up).
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MERGED = {
    "q_proj": "qkv",
    "k_proj": "qkv",
    "v_proj": "qkv",
    "o_proj": "o",
    "gate_proj": "gate_up",
    "up_proj": "gate_up",
    "down_proj": "down",
}
KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# adapter_config.json fields whose non-default value changes what the adapter computes
# in ways this engine does not: refused by name.
UNSUPPORTED_FIELDS = {
    "use_dora": (False, None),
    "bias": ("none", None),
    "modules_to_save": (None, []),
    "fan_in_fan_out": (False, None),
    "rank_pattern": ({}, None),
    "alpha_pattern": ({}, None),
    "lora_bias": (False, None),
    "layer_replication": (None, []),
    "target_parameters": (None, []),
}


@dataclass(frozen=True)
class LoRAPart:
    """One projection's low-rank update inside its merged projection: output columns
    ``out_start .. out_start + b.shape[0]`` take ``(x @ a^T) @ b^T``."""

    out_start: int
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r], the scaling folded in


@dataclass(frozen=True)
class LoRAAdapter:
    name: str
    path: str
    rank: int
    # What the adapter says it was trained on (adapter_config.json's base_model_name_or_path)
    base_model: str | None
    # (layer, merged projection: "qkv", "o", "gate_up", "down") -> its parts
    parts: dict[tuple[int, str], tuple[LoRAPart, ...]]
    # A hash of the adapter's files: salts the prefix cache's block hashes, so that one
    # adapter's KV never serves another's (the same files give the same KV).
    fingerprint: int

    @property
    def num_parameters(self) -> int:
        return sum(p.a.numel() + p.b.numel() for ps in self.parts.values() for p in ps)


def refuse(message: str) -> ValidationError:
    return ValidationError(message, param="lora_path")


def read_adapter(
    name: str, path: str, model: ModelConfig, max_rank: int, dtype: torch.dtype
) -> LoRAAdapter:
    """The adapter in folder ``path``, checked against ``model``, its tensors in
    ``dtype``; ValidationError (param lora_path) naming the problem otherwise."""
    folder = Path(path)
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / file).is_file():
            raise refuse(f"LoRA adapter {name!r}: {file} is missing in {path}")
    try:
        config_bytes = (folder / CONFIG_FILE).read_bytes()
        weight_bytes = (folder / WEIGHTS_FILE).read_bytes()
    except OSError as exc:
        raise refuse(f"LoRA adapter {name!r}: cannot read {path}: {exc}") from None
    config = _read_config(name, config_bytes)
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise refuse(f"LoRA adapter {name!r}: adapter_config.json's r must be a rank >= 1")
    if rank > max_rank:
        raise refuse(f"LoRA adapter {name!r} has rank {rank}, above max_lora_rank ({max_rank})")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise refuse(f"LoRA adapter {name!r}: lora_alpha must be a number")
    scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    base = config.get("base_model_name_or_path")
    tensors = _read_tensors(name, weight_bytes)
    parts = _merged_parts(name, base, tensors, model, rank, scaling, dtype)
    digest = hashlib.blake2b(config_bytes + weight_bytes, digest_size=8).digest()
    # Even: LongRoPE's salt sets the low bit (core/sequence.py).
    fingerprint = int.from_bytes(digest, "little") & ~1
    return LoRAAdapter(name, path, rank, base, parts, fingerprint)


def _read_config(name: str, raw: bytes) -> dict[str, Any]:
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise refuse(f"LoRA adapter {name!r}: adapter_config.json is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise refuse(f"LoRA adapter {name!r}: adapter_config.json is not a JSON object")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise refuse(f"LoRA adapter {name!r}: peft_type {peft_type!r} is not LORA")
    for field, defaults in UNSUPPORTED_FIELDS.items():
        if config.get(field) not in defaults:
            raise refuse(
                f"LoRA adapter {name!r}: {field}={config[field]!r} is not supported "
                "(plain LoRA on q/k/v/o and gate/up/down only)"
            )
    return config


def _read_tensors(name: str, raw: bytes) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(raw)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise refuse(f"LoRA adapter {name!r}: {WEIGHTS_FILE} cannot be read: {exc}") from None


def expected_shape(model: ModelConfig, module: str) -> tuple[int, int]:
    """(in, out) features of one projection of ``model``'s layers."""
    q_size = model.num_heads * model.head_dim
    kv_size = model.num_kv_heads * model.head_dim
    hidden, intermediate = model.hidden_size, model.intermediate_size
    return {
        "q_proj": (hidden, q_size),
        "k_proj": (hidden, kv_size),
        "v_proj": (hidden, kv_size),
        "o_proj": (q_size, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }[module]


def out_start(model: ModelConfig, module: str) -> int:
    """Where ``module``'s output columns start in its merged projection's output."""
    q_size = model.num_heads * model.head_dim
    kv_size = model.num_kv_heads * model.head_dim
    starts = {"k_proj": q_size, "v_proj": q_size + kv_size, "up_proj": model.intermediate_size}
    return starts.get(module, 0)


def _merged_parts(
    name: str,
    base: str | None,
    tensors: dict[str, torch.Tensor],
    model: ModelConfig,
    config_rank: int,
    scaling: float,
    dtype: torch.dtype,
) -> dict[tuple[int, str], tuple[LoRAPart, ...]]:
    """The tensors by (layer, module), checked, then grouped by merged projection."""
    built_for = f" (built for {base})" if base else ""
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = KEY.search(key)
        if match is None or match.group(2) not in MODULES:
            raise refuse(
                f"LoRA adapter {name!r}: tensor {key!r} is not on a supported module "
                f"({', '.join(MODULES)} of the decoder layers)"
            )
        layer, module, which = int(match.group(1)), match.group(2), match.group(3)
        if layer >= model.num_layers:
            raise refuse(
                f"LoRA adapter {name!r}{built_for} does not fit this model: {key!r} is on "
                f"layer {layer}, the model has {model.num_layers}"
            )
        pairs.setdefault((layer, module), {})[which] = tensor
    if not pairs:
        raise refuse(f"LoRA adapter {name!r}: {WEIGHTS_FILE} holds no LoRA weights")
    merged: dict[tuple[int, str], list[LoRAPart]] = {}
    for (layer, module), pair in sorted(pairs.items()):
        where = f"layer {layer} {module}"
        if set(pair) != {"A", "B"}:
            raise refuse(f"LoRA adapter {name!r}: {where} has lora_{next(iter(pair))} alone")
        a, b = pair["A"], pair["B"]
        in_features, out_features = expected_shape(model, module)
        rank = a.shape[0] if a.dim() == 2 else -1
        if (
            a.dim() != 2
            or b.dim() != 2
            or a.shape[1] != in_features
            or b.shape
            != (
                out_features,
                rank,
            )
        ):
            raise refuse(
                f"LoRA adapter {name!r}{built_for} does not fit this model: {where} has "
                f"lora_A {list(a.shape)} and lora_B {list(b.shape)}, expected "
                f"[r, {in_features}] and [{out_features}, r]"
            )
        if rank != config_rank:
            raise refuse(
                f"LoRA adapter {name!r}: {where} has rank {rank}, adapter_config.json's r "
                f"is {config_rank}"
            )
        # The scaling is applied in fp32, then rounded once to the model's dtype.
        scaled_b = (b.float() * scaling).to(dtype).contiguous()
        part = LoRAPart(out_start(model, module), a.to(dtype).contiguous(), scaled_b)
        merged.setdefault((layer, MERGED[module]), []).append(part)
    return {key: tuple(parts) for key, parts in merged.items()}
