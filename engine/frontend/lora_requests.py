"""The engine's LoRA side as its callers see it (LLMEngine.adapters): adapters loaded
and unloaded by name, a request's adapter named or resolved, and which adapters the
queues hold (vLLM's vllm:lora_requests_info). Its calls run on the engine's thread,
between steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetero_infer.engine.lora import LoRAManager, LoRANotFoundError, LoRARequest
from hetero_infer.engine.lora.adapter import LoRAAdapter
from hetero_infer.engine.settings.exceptions import ValidationError

if TYPE_CHECKING:
    from hetero_infer.engine.core.scheduler import Scheduler


def lora_disabled() -> ValidationError:
    return ValidationError(
        "LoRA adapters are not enabled on this engine (start it with enable_lora)",
        param="lora_name",
    )


class LoRARequests:
    def __init__(self, lora: LoRAManager | None, scheduler: Scheduler) -> None:
        """``lora``: the adapters' slots, None unless enable_lora; ``scheduler``: whose
        sequences hold slots."""
        self.lora = lora
        self.scheduler = scheduler

    def load(self, name: str, path: str, load_inplace: bool = False) -> LoRARequest:
        """Load the PEFT adapter in folder ``path`` under ``name``: ValidationError naming
        the problem (and nothing changed) if it cannot be served. ``load_inplace``
        (vLLM's): it replaces an adapter loaded under ``name``, which stays loaded if the
        new one is refused."""
        if self.lora is None:
            raise lora_disabled()
        if not isinstance(name, str) or not name:
            raise ValidationError("lora_name must be a non-empty string", param="lora_name")
        if not isinstance(path, str) or not path:
            raise ValidationError("lora_path must be a non-empty string", param="lora_path")
        if load_inplace:
            return self.lora.replace(name, path, self.slots_in_use())
        return self.lora.load(name, path)

    def unload(self, name: str) -> None:
        """Unload ``name`` (LoRANotFoundError if none is loaded): requests already running
        on it finish with it; new ones are refused."""
        if self.lora is None:
            raise lora_disabled()
        self.lora.unload(name, self.slots_in_use())

    def loaded(self) -> list[LoRAAdapter]:
        return [] if self.lora is None else self.lora.adapters

    def resolve(self, lora: LoRARequest | str | None) -> LoRARequest | None:
        """A request's adapter, given by name or as resolved before."""
        if lora is None or isinstance(lora, LoRARequest):
            return lora
        if self.lora is None:
            raise lora_disabled()
        resolved = self.lora.resolve(lora)
        if resolved is None:
            raise LoRANotFoundError(f"LoRA adapter {lora!r} is not loaded")
        return resolved

    def check(self, lora: LoRARequest | None) -> None:
        """Before a request is queued: its adapter is still the one loaded."""
        if lora is None:
            return
        if self.lora is None:
            raise lora_disabled()
        self.lora.check(lora)

    def slots_in_use(self) -> set[int]:
        return {seq.lora_slot for seq in self.scheduler.queues.sequences.values()}

    def free_unloaded(self) -> None:
        """After a step: the unloaded adapters' slots whose last request has finished."""
        if self.lora is not None and self.lora.has_retiring:
            self.lora.free_unused(self.slots_in_use())

    def requests_info(self) -> tuple[list[str], list[str]]:
        """The adapters of the running and of the waiting requests, by name (sorted)."""
        if self.lora is None:
            return [], []
        names = self.lora.slot_names()

        def of(seqs: tuple) -> list[str]:
            return sorted({names[s.lora_slot] for s in seqs if s.lora_slot in names})

        # Copied in one call: /metrics reads them from the event loop's thread.
        return of(tuple(self.scheduler.queues.running)), of(tuple(self.scheduler.queues.waiting))
