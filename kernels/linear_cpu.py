"""bf16 linear layers on the CPU with weights packed once.

Where the C++ kernels are built with AVX512-BF16 (kernels/csrc/linear_cpu.cpp), a
weight whose output count is a multiple of 32 and input count even is packed into
that kernel's panels: in the offline benchmark's step shapes, with weights streamed
from memory as in a real step, it ran 350-440 GFLOP/s at 32-128 rows where oneDNN ran
290-370, and about twice oneDNN's rate at 1-8 rows. Other weights go to oneDNN, also
on a copy packed once into its blocked layout (``_reorder_linear_weight``): torch's
``F.linear`` reorders the weight on every call, 10-25% slower. A packed copy is kept
beside its weight (e.g. 270 MB for SmolLM2) and made again if the weight changes in
place. Where neither is available, torch's ``F.linear`` runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from hetero_infer.kernels.cpu_extension import cpu_kernels
from torch.utils.weak import WeakIdKeyDictionary

logger = logging.getLogger(__name__)

# weight -> (its version when packed, packed copy); dropped with the weight. Merged
# gate_up weights packed for the fused SiLU-and-mul have a cache of their own.
_packed: WeakIdKeyDictionary = WeakIdKeyDictionary()
_packed_gated: WeakIdKeyDictionary = WeakIdKeyDictionary()
_unavailable = False


def packed_linear_serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``packed_linear`` takes x @ weight^T: bf16 CPU tensors where our kernel
    or oneDNN runs."""
    return (
        x.is_cpu
        and x.dtype == weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and (_kernel_serves(weight) or (not _unavailable and torch.backends.mkldnn.is_available()))
    )


def _kernel_serves(weight: torch.Tensor) -> bool:
    """Whether the AVX512-BF16 kernel takes this bf16 weight [out, in]."""
    module = cpu_kernels()
    return (
        module is not None
        and module.linear_packed_available()
        and weight.shape[0] % 32 == 0
        and weight.shape[1] % 2 == 0
    )


def _packed_weight(
    weight: torch.Tensor,
    pack: Callable[[torch.Tensor], torch.Tensor],
    cache: WeakIdKeyDictionary = _packed,
) -> torch.Tensor:
    version = weight._version
    entry = cache.get(weight)
    if entry is None or entry[0] != version:
        entry = (version, pack(weight.detach()))
        cache[weight] = entry
    return entry[1]


def packed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., in] @ weight^T + bias by our kernel or oneDNN on the packed weight
    (torch's F.linear if neither runs)."""
    global _unavailable
    if _kernel_serves(weight):
        module = cpu_kernels()
        packed = _packed_weight(weight, module.pack_linear_weight)
        out = module.linear_packed(x.reshape(-1, x.shape[-1]), packed, bias)
        return out.view(*x.shape[:-1], weight.shape[0])
    try:
        packed = _packed_weight(weight, lambda w: torch.ops.mkldnn._reorder_linear_weight(w, 128))
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    except (AttributeError, RuntimeError) as exc:
        _unavailable = True
        logger.warning("packed oneDNN linear unavailable, using F.linear: %s", exc)
        return torch.nn.functional.linear(x, weight, bias)


def gated_linear_serves(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``gated_linear`` takes silu-and-mul of x @ weight^T: bf16 CPU tensors,
    no bias, a weight the kernel takes."""
    return (
        bias is None
        and x.is_cpu
        and x.dtype == weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and _kernel_serves(weight)
    )


def gated_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., in], weight [2 * d, in] (gate rows, then up rows) -> silu(gate) * up
    [..., d], from the kernel's fp32 sums in one pass."""
    module = cpu_kernels()
    packed = _packed_weight(weight, module.pack_gated_linear_weight, _packed_gated)
    out = module.linear_packed(x.reshape(-1, x.shape[-1]), packed, None, gated=True)
    return out.view(*x.shape[:-1], weight.shape[0] // 2)
