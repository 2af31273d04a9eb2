"""Weight-only int8: compressed-tensors checkpoints as they are stored, and float
checkpoints quantized at load (``quantization int8``).

A compressed-tensors checkpoint (what llm-compressor writes, and vLLM and SGLang load)
names its scheme in config.json's ``quantization_config``. The one taken here is W8A16:
8-bit symmetric integers with one scale per output channel, the activations left in
floating point. Its linear weights are stored as ``X.weight`` (int8; the
"int-quantized" and "naive-quantized" formats) or ``X.weight_packed`` (four values
plus 128 per little-endian int32, with ``X.weight_shape``; "pack-quantized"), each
with ``X.weight_scale`` [out, 1]. Layers the scheme ignores (lm_head, usually) stay in
floating point. Any other scheme is refused by name, as vLLM refuses what it cannot run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import INT8, QuantizedWeight, quantize_int8

COMPRESSED_TENSORS = "compressed-tensors"
INT8_FORMATS = ("int-quantized", "naive-quantized", "pack-quantized")
SCALE_SUFFIX = ".weight_scale"
# The linear layers of a decoder block: what `quantization int8` quantizes, the experts
# and shared experts of a mixture-of-experts layer too (Mixtral's experts' w1, w2, w3).
# The embedding, lm_head and the router stay as they are (vLLM's W8A16 checkpoints
# leave lm_head too).
LINEAR_WEIGHT = re.compile(
    r"model\.layers\.\d+\.(\w+|mlp\.shared_expert|\w+\.experts\.\d+)\."
    r"((q|k|v|o|gate|up|down)_proj|w[123])\.weight"
)


def checkpoint_quantization(folder: Path) -> dict[str, Any] | None:
    """config.json's quantization_config where there is one: a compressed-tensors
    weight-only int8 scheme, or ConfigError naming what is not supported."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text()).get("quantization_config")
    if config is None:
        return None
    method = config.get("quant_method")
    if method != COMPRESSED_TENSORS:
        raise ConfigError(
            f"quantization method {method!r} (config.json's quantization_config) is not "
            f"supported: quantized weights load from GGUF files and from {COMPRESSED_TENSORS} "
            "weight-only int8 (W8A16) checkpoints"
        )
    if config.get("format") not in INT8_FORMATS:
        raise ConfigError(
            f"{COMPRESSED_TENSORS} format {config.get('format')!r} is not supported; "
            f"supported: {', '.join(INT8_FORMATS)} with 8-bit weights"
        )
    for name, group in (config.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        scheme = (
            weights.get("num_bits"),
            weights.get("type"),
            weights.get("symmetric"),
            weights.get("strategy"),
        )
        if scheme != (8, "int", True, "channel") or group.get("input_activations"):
            raise ConfigError(
                f"{COMPRESSED_TENSORS} scheme {name!r} is not supported: only weight-only "
                "int8 (8-bit, symmetric, one scale per channel, no input activation "
                f"quantization) is; this one has weights {weights} and input_activations "
                f"{group.get('input_activations')}"
            )
    return config


def is_quantization_parameter(name: str) -> bool:
    """Tensors loaded in their own precision, not the model's dtype."""
    return name.endswith(SCALE_SUFFIX)


def take_int8_weights(
    state_dict: dict[str, torch.Tensor | QuantizedWeight], dtype: torch.dtype, keep: bool
) -> None:
    """A compressed-tensors checkpoint's int8 weights and scales, in place, as
    QuantizedWeight (``keep``) or dequantized to ``dtype``."""
    for scale_name in [name for name in state_dict if name.endswith(SCALE_SUFFIX)]:
        name = scale_name.removesuffix("_scale")  # X.weight
        scales = state_dict.pop(scale_name).float().reshape(-1)
        packed = state_dict.pop(name + "_packed", None)
        if packed is not None:
            shape = tuple(int(d) for d in state_dict.pop(name + "_shape"))
            # Each int32 holds four values plus 128, the first in its lowest byte.
            unsigned = packed.contiguous().view(torch.uint8)[:, : shape[1]]
            values = (unsigned.to(torch.int16) - 128).to(torch.int8)
        else:
            values = state_dict.pop(name)
        if values.dtype != torch.int8 or values.dim() != 2 or values.shape[0] != scales.numel():
            raise ConfigError(
                f"{name}: expected int8 [out, in] with one scale per output row; got "
                f"{values.dtype} {list(values.shape)} and {scales.numel()} scales"
            )
        weight = QuantizedWeight(INT8, values.contiguous(), tuple(values.shape), scales)
        state_dict[name] = weight if keep else weight.dequantize(dtype)


def quantize_linear_weights(state_dict: dict[str, torch.Tensor | QuantizedWeight]) -> None:
    """The decoder blocks' float linear weights quantized to int8 per row, in place."""
    for name, tensor in state_dict.items():
        if LINEAR_WEIGHT.fullmatch(name) and isinstance(tensor, torch.Tensor):
            state_dict[name] = quantize_int8(tensor)
