"""bf16 linear layers on the CPU through oneDNN with weights packed once.

torch's bf16 ``F.linear`` on the CPU calls oneDNN, which reorders the weight into its
blocked layout on every call. Packing each weight once (``_reorder_linear_weight``)
and multiplying with the packed copy made the model's projections 10-25% faster at
the batch sizes of a step (64-2048 rows). (At 1-4 rows the bf16 matrix-vector kernel
serves instead: it streams weights from memory faster still.) The packed copies
are kept beside their weights (an extra copy of each, e.g. 270 MB for SmolLM2) and
made again if a weight changes in place. Where oneDNN lacks these ops, torch's
``F.linear`` runs.
"""

from __future__ import annotations

import logging

import torch
from torch.utils.weak import WeakIdKeyDictionary

logger = logging.getLogger(__name__)

# weight -> (its version when packed, packed copy); dropped with the weight.
_packed: WeakIdKeyDictionary = WeakIdKeyDictionary()
_unavailable = False


def packed_linear_serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``packed_linear`` takes x @ weight^T: bf16 CPU tensors where oneDNN runs."""
    return (
        not _unavailable
        and x.is_cpu
        and x.dtype == weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
    )


def _packed_weight(weight: torch.Tensor) -> torch.Tensor:
    version = weight._version
    entry = _packed.get(weight)
    if entry is None or entry[0] != version:
        entry = (version, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 128))
        _packed[weight] = entry
    return entry[1]


def packed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., in] @ weight^T + bias by oneDNN on the packed weight (torch's F.linear if
    the ops are missing)."""
    global _unavailable
    try:
        return torch.ops.mkldnn._linear_pointwise(x, _packed_weight(weight), bias, "none", [], "")
    except (AttributeError, RuntimeError) as exc:
        _unavailable = True
        logger.warning("packed oneDNN linear unavailable, using F.linear: %s", exc)
        return torch.nn.functional.linear(x, weight, bias)
