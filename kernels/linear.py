"""Linear layers as the model calls them: a weight prepared once, then called per step.

``KernelOps.pack_linear(weight, bias)`` returns one of these (or a packed CPU form,
kernels/linear_cpu.py) when the model's weights are loaded; a step then calls it with
the activations only. A packed copy is a snapshot: a weight changed in place afterwards
needs packing again.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# x [..., in] -> [..., out]: a weight bound to its kernel.
LinearFn = Callable[[torch.Tensor], torch.Tensor]


class TorchLinear:
    """torch's F.linear on the weight as it is (it reads the weight at every call, so
    in-place changes show)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class GatedLinear:
    """activation_and_mul(linear(x)) in two steps, where no kernel fuses them: ``linear``
    gives [..., 2 * d] (gate, then up), ``activation_and_mul`` (SiLU-and-mul, or GELU's)
    makes it [..., d]."""

    def __init__(
        self,
        linear: LinearFn,
        activation_and_mul: Callable[[torch.Tensor], torch.Tensor],
        activation: str,
    ) -> None:
        self.linear, self.activation_and_mul = linear, activation_and_mul
        self.activation = activation  # the HF name: "silu", "gelu_pytorch_tanh"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation_and_mul(self.linear(x))


def unfused(linear: LinearFn) -> LinearFn:
    """The linear layer inside a GatedLinear (whose weight it packs), else itself."""
    return linear.linear if isinstance(linear, GatedLinear) else linear
