"""How a vision side takes its weights: the checkpoint's tensors assigned to its
parameters by name (built on the meta device, it holds no memory before), then its
projections packed for the kernels, as the decoder packs its own (layers.Linear: on the
CPU in bf16, our AMX or AVX-512 kernel, or oneDNN's, on a copy packed once; in fp32,
torch's F.linear, whose sums are transformers' own).

A vision side loads and packs on its own (VisionLanguageModel.loaded_apart), so that it
also runs alone, as its tests build it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from hetero_infer.engine.models.layers import Linear, pack_linears
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import KernelOps
from torch import nn


def vision_linear(in_features: int, out_features: int, ops: KernelOps, bias: bool = True) -> Linear:
    """A vision projection (nn.Linear's parameters and names), run by ``ops``' kernels."""
    return Linear(in_features, out_features, bias, ops.pack_linear)


def load_vision_weights(module: nn.Module, weights: Mapping[str, Any], family: str) -> None:
    """``weights`` (by ``module``'s own names) assigned to ``module``, every parameter
    given and no other, then its projections packed; a ConfigError names what is wrong,
    after ``family`` (a model family's name)."""
    not_tensors = [name for name, tensor in weights.items() if not isinstance(tensor, torch.Tensor)]
    if not_tensors:
        raise ConfigError(f"{family} vision weights must be plain tensors: {not_tensors[:3]}")
    missing, unexpected = module.load_state_dict(weights, strict=False, assign=True)
    if missing or unexpected:
        raise ConfigError(
            f"{family} vision weights: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    pack_linears(module)
