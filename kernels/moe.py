"""A mixture-of-experts block as the kernels take it: ``MoeLayerSpec``, which the model
gives once its weights are packed (engine/models/moe.py), and ``KernelOps.pack_moe``
turns into one call per step where the device has a kernel for it (the CPU's:
kernels/moe_cpu.py), or None (the model then runs its torch reference).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hetero_infer.kernels.linear import LinearFn
from hetero_infer.kernels.quantized import QuantizedWeight


@dataclass(frozen=True)
class MoeLayerSpec:
    """A sparse layer's MLP: a router, its top-k experts' outputs summed by their
    weights, and a shared expert beside them where the model has one."""

    router: torch.Tensor  # [num_experts, hidden] in the model's dtype
    # The experts' gate_up [2 * width, hidden] (gate rows, then up rows) and down
    # [hidden, width]: one weight per expert kept quantized, or float stacks
    # [num_experts, ...] in the model's dtype
    gate_up: list[QuantizedWeight] | torch.Tensor
    down: list[QuantizedWeight] | torch.Tensor
    activation: str  # the HF name: "silu", "gelu_pytorch_tanh"
    top_k: int
    renormalize: bool  # the top-k softmax probabilities divided by their sum
    # The shared expert's gate_up (activation fused) and down, and its sigmoid gate's
    # weight [1, hidden]; None where there is none
    shared: tuple[LinearFn, LinearFn, torch.Tensor] | None = None


def no_moe_kernel(spec: MoeLayerSpec) -> None:
    return None
