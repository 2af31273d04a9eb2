"""How a checkpoint's expert tensors become a sparse layer's stacked expert weights.

Hugging Face checkpoints of Mixtral, Qwen-MoE and OLMoE store one tensor per expert and
projection (``mlp.experts.{e}.gate_proj.weight``, renamed from Mixtral's w1/w3/w2);
transformers 5 may save them stacked already (``mlp.experts.gate_up_proj``
[experts, 2 * width, hidden], ``mlp.experts.down_proj``); the GGUF loader gives a merged
ffn_*_exps tensor as one tensor per expert. Float experts are stacked into the model's
parameters; quantized ones are kept as one weight per expert (gate and up rows joined),
for the grouped-by-expert kernel.
"""

from __future__ import annotations

import re

import torch
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import QuantizedWeight, concat_rows

Weight = torch.Tensor | QuantizedWeight
# "layers.3.mlp.experts.17.gate_proj.weight" -> ("layers.3.mlp.experts", 17, "gate_proj")
EXPERT_RE = re.compile(r"(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def gather_experts(
    state_dict: dict[str, Weight], dtype: torch.dtype
) -> dict[str, Weight | list[QuantizedWeight]]:
    """The state dict with each layer's per-expert tensors replaced by
    ``<prefix>.gate_up_proj`` and ``<prefix>.down_proj``: stacked float tensors, or, where
    every expert's blocks are quantized alike, lists of one QuantizedWeight per expert
    (gate_up: gate rows, then up rows). ConfigError where an expert's tensor is
    missing."""
    out: dict[str, Weight | list[QuantizedWeight]] = {}
    found: dict[str, dict[int, dict[str, Weight]]] = {}
    for name, tensor in state_dict.items():
        match = EXPERT_RE.fullmatch(name)
        if match is None:
            out[name] = tensor
            continue
        prefix, expert, projection = match.group(1), int(match.group(2)), match.group(3)
        found.setdefault(prefix, {}).setdefault(expert, {})[projection] = tensor
    for prefix, experts in found.items():
        count = max(experts) + 1
        missing = [
            f"{prefix}.{e}.{p}"
            for e in range(count)
            for p in PROJECTIONS
            if p not in experts.get(e, {})
        ]
        if missing:
            raise ConfigError(f"checkpoint is missing expert tensors: {missing[:5]}")
        gate_up = [_join([experts[e]["gate_proj"], experts[e]["up_proj"]]) for e in range(count)]
        down = [experts[e]["down_proj"] for e in range(count)]
        out[f"{prefix}.gate_up_proj"] = _stack(gate_up, dtype)
        out[f"{prefix}.down_proj"] = _stack(down, dtype)
    return out


def _join(parts: list[Weight]) -> Weight:
    """Gate and up rows of one expert: quantized where both are of one type."""
    if all(isinstance(p, QuantizedWeight) for p in parts):
        joined = concat_rows(parts)
        if joined is not None:
            return joined
    return torch.cat(
        [p.dequantize(torch.float32) if isinstance(p, QuantizedWeight) else p for p in parts]
    )


def _stack(weights: list[Weight], dtype: torch.dtype) -> torch.Tensor | list[QuantizedWeight]:
    """One weight per expert: kept as a list where all are quantized alike, else one
    float tensor [experts, out, in]."""
    if (
        all(isinstance(w, QuantizedWeight) for w in weights)
        and len({(w.qtype, w.shape) for w in weights}) == 1
    ):
        return weights
    return torch.stack(
        [w.dequantize(dtype) if isinstance(w, QuantizedWeight) else w.to(dtype) for w in weights]
    )
