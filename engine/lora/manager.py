"""LoRAManager: the engine's LoRA adapters, loaded and unloaded at run time.

It reads and checks an adapter (adapter.py), gives it a slot (registry.py) and puts
its weights beside the model's layers (model_lora.py), or refuses it having changed
nothing. It runs on the engine's thread, between steps, as requests are taken: a step
never sees an adapter half loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from hetero_infer.engine.lora.adapter import LoRAAdapter, read_adapter
from hetero_infer.engine.lora.model_lora import ModelLoRA
from hetero_infer.engine.lora.registry import LoRANotFoundError, LoRARegistry, LoRARequest
from hetero_infer.engine.models.config import ModelConfig

logger = logging.getLogger(__name__)

__all__ = ["LoRAManager", "LoRANotFoundError", "LoRARequest"]


class LoRAManager:
    def __init__(
        self,
        model_lora: ModelLoRA,
        model_config: ModelConfig,
        max_loras: int,
        max_lora_rank: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.model_lora = model_lora
        self.model_config = model_config
        self.registry = LoRARegistry(max_loras)
        self.max_lora_rank = max_lora_rank
        self.device, self.dtype = device, dtype

    @property
    def max_loras(self) -> int:
        return self.registry.max_loras

    def load(self, name: str, path: str) -> LoRARequest:
        """Load the adapter in folder ``path`` as ``name``; ValidationError naming the
        problem (nothing loaded) otherwise."""
        self.registry.check_can_load(name)
        return self._install(self._read(name, path))

    def replace(self, name: str, path: str, slots_in_use: Iterable[int]) -> LoRARequest:
        """vLLM's load_inplace: ``name`` serves the adapter in folder ``path`` from now on
        (loaded as by ``load`` where no adapter has that name). The new adapter is read,
        checked and sure of a slot before the old one is unloaded, so that one that
        cannot be served is refused (ValidationError naming the problem) with the old
        one still loaded and serving: the new files may well be where the old ones were."""
        if self.registry.resolve(name) is None:
            return self.load(name, path)
        adapter = self._read(name, path)
        in_use = set(slots_in_use)
        self.registry.check_can_replace(name, in_use)
        self.unload(name, in_use)
        return self._install(adapter)

    def _read(self, name: str, path: str) -> LoRAAdapter:
        return read_adapter(name, path, self.model_config, self.max_lora_rank, self.dtype)

    def _install(self, adapter: LoRAAdapter) -> LoRARequest:
        request = self.registry.add(adapter)
        self.model_lora.install(request.slot, adapter, self.device)
        logger.info(
            "LoRA adapter %r loaded from %s into slot %d (rank %d, %d parameters)",
            adapter.name,
            adapter.path,
            request.slot,
            adapter.rank,
            adapter.num_parameters,
        )
        return request

    def unload(self, name: str, slots_in_use: Iterable[int]) -> None:
        """Take ``name`` away (LoRANotFoundError if none is loaded): new requests for it
        are refused, and its slot frees once the requests running on it have finished."""
        self.registry.retire(name)
        self.free_unused(set(slots_in_use))
        logger.info("LoRA adapter %r unloaded", name)

    def free_unused(self, slots_in_use: set[int]) -> None:
        """Free the unloaded adapters' slots that no sequence uses any more."""
        for slot in self.registry.free_retired(slots_in_use):
            self.model_lora.remove(slot)

    @property
    def has_retiring(self) -> bool:
        return self.registry.num_retiring > 0

    def resolve(self, name: str) -> LoRARequest | None:
        """The loaded adapter called ``name``, or None."""
        return self.registry.resolve(name)

    def check(self, request: LoRARequest) -> None:
        """LoRANotFoundError unless the request's adapter is still loaded."""
        self.registry.check(request)

    @property
    def adapters(self) -> list[LoRAAdapter]:
        """The loaded adapters (not those unloaded and still finishing requests)."""
        return self.registry.loaded

    def slot_names(self) -> dict[int, str]:
        """Every occupied slot's adapter name (the unloaded ones' too)."""
        slots = dict(self.registry.slots)  # copied in one call: /metrics reads it too
        return {slot: entry.adapter.name for slot, entry in slots.items()}
