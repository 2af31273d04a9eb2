"""The gated MLP activations over a merged [gate | up] input: SiLU-and-mul (Llama's
SwiGLU) and tanh-approximated GELU-and-mul (Gemma's GeGLU); and that GELU alone (the
SigLIP vision towers' MLP)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    # x: [num_tokens, 2 * intermediate] -> [num_tokens, intermediate]
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def gelu_tanh_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    # x: [num_tokens, 2 * intermediate] -> [num_tokens, intermediate]
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


def gelu_tanh_ref(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")
