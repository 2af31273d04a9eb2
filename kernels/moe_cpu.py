"""A mixture-of-experts block in one call to the C++ kernels (kernels/csrc/moe_cpu.cpp),
on experts kept quantized in the checkpoint's blocks.

Per token only its top-k experts' weights are read, so a decode step on the CPU is
bound by reading the active experts once: the kernel sorts the step's (token, expert)
pairs by expert and multiplies each active expert's weights with all its tokens in one
pass (the quantized kernel's panels, kernels/linear_quantized.py), the active experts
of a step split among the threads by work; then the down projections alike, and each
token's outputs summed in C++, weighted by the router. Routing (softmax, top-k,
renormalizing) and the shared expert run in the same call, so the model's layer and
the decoder stack call the same code.

It takes experts whose gate_up and down are each of one quantized type the kernel
takes (every expert alike), and a shared expert whose projections are our kernels';
otherwise ``pack_moe`` gives None and the model runs its torch reference.
"""

from __future__ import annotations

from types import ModuleType

import torch
from hetero_infer.kernels.decoder_stack_cpu import packed_linear
from hetero_infer.kernels.linear_quantized import quantized_kernel_takes
from hetero_infer.kernels.moe import MoeLayerSpec
from hetero_infer.kernels.quantized import QuantizedWeight

# The gated activations the kernel applies (by their HF names)
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


class CpuMoe:
    """x [tokens, hidden] -> the block's output, by the C++ MoeBlock (``block``, which
    the decoder stack calls too)."""

    def __init__(self, block: object) -> None:
        self.block = block

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.block.forward(x)


def stacked_panels(module: ModuleType, weights: list[QuantizedWeight]) -> torch.Tensor:
    """Each expert's weight in quantized_linear's panels, stacked: uint8 [experts,
    panels, panel_bytes]. The experts' rows are packed as one weight (whole panels
    each: rows a multiple of 16), so that no expert's copy is held twice."""
    first = weights[0]
    rows = torch.cat([w.data.view(torch.uint8) for w in weights])
    scales = None if first.scales is None else torch.cat([w.scales for w in weights])
    packed = module.pack_quantized_weight(rows, first.qtype, scales)
    return packed.view(len(weights), -1, packed.shape[-1])


def kernel_takes(module: ModuleType, weights: list[QuantizedWeight] | torch.Tensor) -> bool:
    return (
        isinstance(weights, list)
        and len({(w.qtype, w.shape) for w in weights}) == 1
        and quantized_kernel_takes(module, weights[0])
    )


def pack_moe(module: ModuleType | None, spec: MoeLayerSpec) -> CpuMoe | None:
    """The C++ block where the kernels take the spec's experts (see the module's
    docstring); else None."""
    if module is None or spec.activation not in ACTIVATIONS:
        return None
    if not (kernel_takes(module, spec.gate_up) and kernel_takes(module, spec.down)):
        return None
    shared_gate_up = shared_down = shared_gate = None
    if spec.shared is not None:
        shared_gate_up = packed_linear(module, spec.shared[0])
        shared_down = packed_linear(module, spec.shared[1])
        shared_gate = spec.shared[2]
        if shared_gate_up is None or shared_down is None:
            return None
    block = module.MoeBlock(
        spec.router,
        stacked_panels(module, spec.gate_up),
        spec.gate_up[0].qtype,
        stacked_panels(module, spec.down),
        spec.down[0].qtype,
        spec.activation,
        spec.gate_up[0].activation_bits,
        spec.top_k,
        spec.renormalize,
        shared_gate_up=shared_gate_up,
        shared_down=shared_down,
        shared_gate=shared_gate,
    )
    return CpuMoe(block)
