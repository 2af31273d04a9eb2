"""The runner's one fast-path seam: a step the fast path can run goes through it, any
other through the model's layers one by one.

Each device has at most one: CUDA graphs replaying captured decode steps
(cuda_graphs.py), or on the CPU the kernels' one-call decoder stack over the model's
layers, described by the model (``decoder_stack_spec``) and packed by the kernels
(kernels/decoder_stack.py). Both give what the model's forward gives, bit for bit.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from hetero_infer.engine.lora import ModelLoRA
from hetero_infer.engine.models import CausalLM
from hetero_infer.engine.worker.input_batch import ModelInputs
from hetero_infer.kernels import DecoderStackFn, Kernels


class FastPath(Protocol):
    def can_run(self, inputs: ModelInputs) -> bool:
        """Whether this step's inputs fit the fast path."""
        ...

    def run(self, inputs: ModelInputs) -> torch.Tensor:
        """The model's final hidden states [num_tokens, hidden] for the step."""
        ...


def decoder_stack_path(
    model: CausalLM,
    kernels: Kernels,
    kv_caches: list[tuple[torch.Tensor, ...]],
    lora: ModelLoRA | None = None,
) -> DecoderStackPath | None:
    """The one-call stack over ``model``'s packed layers, where the kernels have one.
    With LoRA, a stack that applies adapters itself follows ``lora``'s slots and runs
    the steps with adapters' rows too; another runs only the steps without."""
    stack = kernels.ops.pack_decoder_stack(model.decoder_stack_spec())
    if stack is None:
        return None
    path = DecoderStackPath(model, stack, kv_caches)
    if lora is not None and getattr(stack, "takes_lora", False):
        path.takes_lora = True
        lora.listeners.append(path.lora_slot_changed)
    return path


class DecoderStackPath:
    """The kernels' one-call decoder stack as the fast path: the model's embedding, the
    stack for every layer, the model's final norm."""

    def __init__(
        self, model: CausalLM, stack: DecoderStackFn, kv_caches: list[tuple[torch.Tensor, ...]]
    ) -> None:
        self.model = model
        self.stack = stack
        self.kv_caches = kv_caches
        self.takes_lora = False  # whether it follows the LoRA slots (decoder_stack_path)

    def can_run(self, inputs: ModelInputs) -> bool:
        return (self.takes_lora or not inputs.lora_groups) and self.stack.serves(inputs.meta)

    def run(self, inputs: ModelInputs) -> torch.Tensor:
        model = self.model
        x = model.embed(inputs.input_ids)
        meta, groups = inputs.meta, inputs.lora_groups
        x, residual = self.stack(x, inputs.positions, self.kv_caches, meta, groups)
        return model.final_norm(x, residual)

    def lora_slot_changed(self, slot: int, weights: dict[tuple[int, int], Any] | None) -> None:
        """A LoRA slot loaded ({(layer, projection): packed weights}) or freed (None)."""
        if weights is None:
            self.stack.remove_lora(slot)
        for (layer, projection), packed in (weights or {}).items():
            self.stack.set_lora(layer, projection, slot, packed)
