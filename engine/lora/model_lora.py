"""The adapters' weights beside the model's projections, one set per slot, and the
rows of the running step that take each.

Every decoder layer's merged projections (qkv, o, gate_up, down) get a ``LoRALayer``
as their ``lora`` hook (engine/models/layers.py): a step whose rows use no adapter
runs the base projection as it is; otherwise the base projection runs once over all
rows and each adapter's update is added to its own rows, grouped by adapter
(KernelOps.add_lora). A merged gate_up takes its updates before its activation: where
its kernel fuses the activation (a gated KernelLinear), the updates are set into an
fp32 buffer (add_lora's assign) and the kernel adds them to its sums before activating.
After every load and unload, a projection's adapters' weights are laid side by side in
slot order (KernelOps.colocate_lora), the order a step reads them in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from hetero_infer.engine.lora.adapter import LoRAAdapter
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import GatedLinear, KernelOps, LinearFn, LoRAGroup, unfused

# The merged projections an adapter may change, by the names adapter.py groups them in.
PROJECTIONS = ("qkv", "o", "gate_up", "down")

# A step's adapters: (slot, its rows: None for all of them)
StepGroups = list[tuple[int, torch.Tensor | None]]


def step_groups(slots: np.ndarray, device: torch.device) -> StepGroups:
    """slots [num_tokens] (each token's adapter slot, 0: none) -> the groups of rows
    by adapter, in slot order."""
    used = np.unique(slots)
    used = used[used != 0]
    if len(used) == 1 and bool((slots == used[0]).all()):
        return [(int(used[0]), None)]  # one adapter for the whole step: no gathers
    return [
        (int(slot), torch.from_numpy(np.flatnonzero(slots == slot)).to(device)) for slot in used
    ]


class LoRAStep:
    """The step being run: which rows take which adapter (set by the runner)."""

    def __init__(self) -> None:
        self.groups: StepGroups = []


class LoRALayer:
    """One merged projection's hook: the base projection plus the step's updates."""

    def __init__(self, step: LoRAStep, add_lora: Callable[..., torch.Tensor]) -> None:
        self.step = step
        self.add_lora = add_lora
        # slot -> the adapter's weights here, as the kernels packed them; a slot whose
        # adapter leaves this projection alone has no entry
        self.slots: dict[int, Any] = {}

    def __call__(self, x: torch.Tensor, packed: LinearFn) -> torch.Tensor:
        groups: list[LoRAGroup] = [
            (rows, self.slots[slot]) for slot, rows in self.step.groups if slot in self.slots
        ]
        if not groups:
            return packed(x)
        if getattr(packed, "gated", False):  # the kernel fuses gate_up's activation
            rows = x.reshape(-1, x.shape[-1])
            updates = rows.new_empty(rows.shape[0], 2 * packed.out_features, dtype=torch.float32)
            return packed(x, addend=self.add_lora(updates, rows, groups, assign=True))
        out = self.add_lora(unfused(packed)(x), x, groups)
        return packed.activation_and_mul(out) if isinstance(packed, GatedLinear) else out


# Told (slot, {(layer, projection index): packed weights}) after a load, and (slot, None)
# after a slot is freed: a fast path that applies LoRA itself follows (fast_path.py).
SlotListener = Callable[[int, dict[tuple[int, int], Any] | None], None]


class ModelLoRA:
    def __init__(self, model: torch.nn.Module, ops: KernelOps) -> None:
        self.step = LoRAStep()
        self.pack_lora = ops.pack_lora
        self.colocate_lora = ops.colocate_lora
        self.layers: dict[tuple[int, str], LoRALayer] = {}
        self.listeners: list[SlotListener] = []
        if model.config.moe is not None:
            raise ConfigError(
                f"{model.config.architecture}: LoRA adapters on a mixture-of-experts model "
                "are not supported yet (enable_lora)"
            )
        for index, layer in enumerate(model.layers):
            linears = (
                layer.self_attn.qkv_proj,
                layer.self_attn.o_proj,
                layer.mlp.gate_up_proj,
                layer.mlp.down_proj,
            )
            for name, linear in zip(PROJECTIONS, linears, strict=True):
                linear.lora = self.layers[(index, name)] = LoRALayer(self.step, ops.add_lora)

    def install(self, slot: int, adapter: LoRAAdapter, device: torch.device) -> None:
        """Put the adapter's weights in ``slot`` (free) of every projection it changes."""
        placed: dict[tuple[int, int], Any] = {}
        for (layer, name), parts in adapter.parts.items():
            a = torch.cat([part.a for part in parts]).to(device)  # [R, in]
            starts = np.cumsum([0] + [part.a.shape[0] for part in parts[:-1]])
            packed = self.pack_lora(
                a,
                [
                    (part.out_start, int(start), part.b.to(device))
                    for part, start in zip(parts, starts, strict=True)
                ],
            )
            self.layers[(layer, name)].slots[slot] = packed
            placed[(layer, PROJECTIONS.index(name))] = packed
            self._colocate(self.layers[(layer, name)])
        for listener in self.listeners:
            listener(slot, placed)

    def remove(self, slot: int) -> None:
        for layer in self.layers.values():
            if layer.slots.pop(slot, None) is not None:
                self._colocate(layer)
        for listener in self.listeners:
            listener(slot, None)

    def _colocate(self, layer: LoRALayer) -> None:
        """The projection's adapters' weights side by side, in slot order: the order a
        step's rows take them in (step_groups)."""
        self.colocate_lora([layer.slots[slot] for slot in sorted(layer.slots)])

    def use(self, groups: StepGroups) -> None:
        """The next forward pass's rows by adapter ([]: the base model for every row)."""
        self.step.groups = groups

    def slot_weights(self, slot: int) -> dict[tuple[int, str], Any]:
        """What ``slot`` holds per projection."""
        return {key: layer.slots[slot] for key, layer in self.layers.items() if slot in layer.slots}
