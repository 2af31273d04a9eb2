"""Safetensors checkpoints: the shards the index names, read tensor by tensor."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from hetero_infer.engine.loader.int8 import is_quantization_parameter
from hetero_infer.engine.settings.exceptions import ConfigError


def safetensors_files(folder: Path) -> list[Path]:
    """The files that hold the model's weights."""
    # The index names the shards that belong to the model; stray *.safetensors (a
    # mistral-native consolidated copy, an adapter) must not be mixed in.
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    return sorted(folder.glob("*.safetensors"))


def load_safetensors(folder: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's checkpoint: floating-point ones converted to `dtype`
    (quantization scales to fp32), integer ones (int8 weights) as they are stored."""
    from safetensors import safe_open

    state_dict: dict[str, torch.Tensor] = {}
    for file in safetensors_files(folder):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                # Old checkpoints saved RoPE's inv_freq buffer; we compute it from the config.
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                if name in state_dict:
                    raise ConfigError(f"{file}: tensor {name!r} also appears in another file")
                tensor = f.get_tensor(name)
                if tensor.is_floating_point():
                    tensor = tensor.to(torch.float32 if is_quantization_parameter(name) else dtype)
                state_dict[name] = tensor
    return state_dict
