"""LoRA's low-rank updates added to a projection's output, grouped by adapter.

A step's rows may each use a different adapter (or none). After the base projection
``out = x @ W^T`` ran once over every row, each adapter's rows take its update:

    out[rows, o : o + n] += (x[rows] @ A^T)[:, k : k + r] @ B^T

for every part (o, k, B [n, r]) of the adapter's weights on this projection (q, k and
v are parts of one merged projection, as gate and up are), with A [R, in] the parts'
A matrices stacked (one shrink for all parts) and the scaling folded into B. This is
what the GPU world calls SGMV (rows grouped by adapter): one pass over the base weight
for the whole batch, then a small pass per adapter over its own rows.

``add_lora_ref`` is the torch reference; the C++ kernel (csrc/lora_cpu.cpp, in fp32
from bf16 rows, rounded once) computes the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

# One part of an adapter's update on a projection: (first output column, first rank
# column in the shrunk activations, B [columns, rank])
LoRAPart = tuple[int, int, torch.Tensor]


class LoRAWeightsRef(NamedTuple):
    """One adapter's weights on one merged projection, as the torch reference takes them."""

    a: torch.Tensor  # [R, in]: the parts' A stacked
    parts: tuple[LoRAPart, ...]


# One adapter's rows in the step (None: every row), and its weights on the projection
# as the kernels packed them (KernelOps.pack_lora)
LoRAGroup = tuple[torch.Tensor | None, Any]


def pack_lora_ref(a: torch.Tensor, parts: Sequence[LoRAPart]) -> LoRAWeightsRef:
    return LoRAWeightsRef(a, tuple(parts))


def add_lora_ref(
    out: torch.Tensor, x: torch.Tensor, groups: Sequence[LoRAGroup], assign: bool = False
) -> torch.Tensor:
    """out [rows, out_features] += each group's update of its rows of x [rows, in];
    returns out (changed in place). assign: out is set to the updates (zero on rows of
    no adapter), whatever it held."""
    if assign:
        out.zero_()
    for rows, (a, parts) in groups:
        xs = x if rows is None else x.index_select(0, rows)
        shrunk = xs @ a.T  # [group rows, R]
        for out_start, rank_start, b in parts:
            rank, width = b.shape[1], b.shape[0]
            delta = shrunk[:, rank_start : rank_start + rank] @ b.T  # [group rows, width]
            target = out[:, out_start : out_start + width]
            if rows is None:
                target += delta
            else:
                target.index_add_(0, rows, delta)
    return out


def colocate_lora_ref(weights: Sequence[Any]) -> None:
    """Where the weights lie does not matter to the reference."""


def cpu_lora_ops(module: Any) -> tuple[Any, Any, Any]:
    """(pack_lora, add_lora, colocate_lora) of the C++ kernel (csrc/lora_cpu.cpp) for
    bf16 and fp32 weights on the CPU, the reference for the others. (fp32 is what a CPU
    without AVX512-BF16 serves in: there the reference's gathers and small matmuls, one
    set per adapter and projection, made a decode step of 16 rows on 8 adapters 1.5x as
    long.)"""

    def pack_lora(a: torch.Tensor, parts: Sequence[LoRAPart]) -> Any:
        if a.dtype not in (torch.bfloat16, torch.float32) or not a.is_cpu:
            return pack_lora_ref(a, parts)
        starts = [p[0] for p in parts], [p[1] for p in parts]
        return module.LoRAWeights(a, *starts, [p[2] for p in parts])

    def add_lora(
        out: torch.Tensor, x: torch.Tensor, groups: Sequence[LoRAGroup], assign: bool = False
    ) -> torch.Tensor:
        if not groups or isinstance(groups[0][1], LoRAWeightsRef):
            return add_lora_ref(out, x, groups, assign)
        module.lora_add(out, x, [rows for rows, _ in groups], [w for _, w in groups], assign)
        return out

    def colocate_lora(weights: Sequence[Any]) -> None:
        if weights and isinstance(weights[0], module.LoRAWeights):
            module.colocate_lora(list(weights))

    return pack_lora, add_lora, colocate_lora
