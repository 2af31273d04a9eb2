"""The loaded LoRA adapters: each in one of max_loras slots, by name.

A slot is what a step's rows name (0: the base model); the runner keeps each slot's
weights beside the layers (engine/lora/model_lora.py). Loading fills a free slot.
Unloading takes the name away at once (new requests for it are refused) and frees the
slot once no sequence uses it any more: the requests already running on it finish with
it, and a slot is never handed to another adapter while a row may still name it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero_infer.engine.lora.adapter import LoRAAdapter
from hetero_infer.engine.settings.exceptions import ModelNotFoundError, ValidationError


class LoRANotFoundError(ModelNotFoundError):
    """A name no loaded adapter has (the server answers 404, as vLLM does)."""


@dataclass(frozen=True)
class LoRARequest:
    """The adapter a request runs with: what the engine checks when it takes the
    request (the adapter may have been unloaded since the name was resolved)."""

    name: str
    slot: int  # 1 .. max_loras
    fingerprint: int  # the adapter's (salts its prefix-cache blocks)
    path: str


@dataclass
class LoadedAdapter:
    adapter: LoRAAdapter
    slot: int
    retiring: bool = False  # unloaded: its slot frees once no sequence uses it

    @property
    def request(self) -> LoRARequest:
        a = self.adapter
        return LoRARequest(a.name, self.slot, a.fingerprint, a.path)


class LoRARegistry:
    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self.slots: dict[int, LoadedAdapter] = {}
        self.by_name: dict[str, LoadedAdapter] = {}  # the loaded ones, not retiring

    def check_can_load(self, name: str) -> int:
        """The free slot an adapter named ``name`` would take; ValidationError where the
        name is taken or every slot is."""
        if name in self.by_name:
            raise ValidationError(
                f"LoRA adapter {name!r} is already loaded (unload it first)", param="lora_name"
            )
        free = [s for s in range(1, self.max_loras + 1) if s not in self.slots]
        if not free:
            retiring = sum(entry.retiring for entry in self.slots.values())
            raise ValidationError(
                f"all {self.max_loras} LoRA slots (max_loras) are in use"
                + (
                    f", {retiring} by unloaded adapters still finishing requests"
                    if retiring
                    else ""
                )
                + ": unload an adapter first",
                param="lora_name",
            )
        return free[0]

    def check_can_replace(self, name: str, slots_in_use: set[int]) -> None:
        """ValidationError where a new adapter for the loaded ``name`` would find no free
        slot: the old one's frees at once only if no sequence uses it."""
        if len(self.slots) < self.max_loras or self.by_name[name].slot not in slots_in_use:
            return
        raise ValidationError(
            f"all {self.max_loras} LoRA slots (max_loras) are in use, {name!r}'s by requests "
            "still running on it: load it in place once they finish, or unload an adapter",
            param="lora_name",
        )

    def add(self, adapter: LoRAAdapter) -> LoRARequest:
        slot = self.check_can_load(adapter.name)
        entry = LoadedAdapter(adapter, slot)
        self.slots[slot] = entry
        self.by_name[adapter.name] = entry
        return entry.request

    def retire(self, name: str) -> None:
        """Take the name away; ``free_retired`` frees its slot later."""
        entry = self.by_name.pop(name, None)
        if entry is None:
            raise LoRANotFoundError(f"LoRA adapter {name!r} is not loaded")
        entry.retiring = True

    def free_retired(self, slots_in_use: set[int]) -> list[int]:
        """Free the retired slots no sequence uses; returns them."""
        freed = [s for s, e in self.slots.items() if e.retiring and s not in slots_in_use]
        for slot in freed:
            del self.slots[slot]
        return freed

    def resolve(self, name: str) -> LoRARequest | None:
        entry = self.by_name.get(name)
        return None if entry is None else entry.request

    def check(self, request: LoRARequest) -> None:
        """ValidationError unless the request's adapter is still the one loaded."""
        entry = self.slots.get(request.slot)
        if entry is None or entry.retiring or entry.adapter.fingerprint != request.fingerprint:
            raise LoRANotFoundError(f"LoRA adapter {request.name!r} has been unloaded")

    @property
    def loaded(self) -> list[LoRAAdapter]:
        # Copied in one call first: the server reads this from another thread.
        return [entry.adapter for entry in list(self.by_name.values())]

    @property
    def num_retiring(self) -> int:
        return sum(entry.retiring for entry in self.slots.values())
