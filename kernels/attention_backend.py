"""What every attention backend takes and does: the step's layout in, its own metadata out.

The model runner builds one ``AttentionInputs`` per step (the layout of the step's
tokens over the paged cache); the backend chosen at start-up turns it, once for all
layers, into the metadata its kernels read (``prepare``), then each layer stores its new
keys and values (``store_kv``) and attends (``forward``). Each backend's metadata is a
subclass of ``AttentionInputs`` holding what that backend alone needs (the torch
reference's masks, the CPU kernels' per-token rows), so no backend carries another's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

import torch


# eq=False: compared by identity (field-wise equality of tensors means nothing here)
@dataclass(frozen=True, eq=False)
class AttentionInputs:
    slot_mapping: torch.Tensor  # [num_tokens] long; -1 = padding, not stored
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0
    context_lens: torch.Tensor  # [num_seqs] int32: cached tokens after this step
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: cu_seqlens of the query chunks
    max_query_len: int
    max_context_len: int

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]

    def common_fields(self) -> dict[str, Any]:
        """The fields above by name, to build a backend's metadata subclass from them
        (``dataclasses.asdict`` would copy the tensors)."""
        return {f.name: getattr(self, f.name) for f in fields(AttentionInputs)}


Metadata = TypeVar("Metadata", bound=AttentionInputs)


class AttentionBackend(ABC, Generic[Metadata]):
    """Paged attention by one family of kernels, chosen once (kernels/selection.py)."""

    name: str
    # Whether a step's metadata lives in the inputs' own tensors only, so that a CUDA
    # graph captured over static input buffers replays any later step.
    supports_cuda_graphs: bool = False

    @abstractmethod
    def prepare(
        self, inputs: AttentionInputs, block_size: int, sliding_windows: set[int | None]
    ) -> Metadata:
        """The step's metadata, shared by every layer; ``sliding_windows`` are the
        windows the model's layers use (None = full attention)."""

    @abstractmethod
    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: Metadata,
    ) -> None:
        """Write key/value [num_tokens, num_kv_heads, head_dim] into their cache slots
        (meta.slot_mapping; -1 skipped). A cache is [num_blocks, block_size,
        num_kv_heads, head_dim]."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: Metadata,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """query [num_tokens, num_heads, head_dim] -> output of the same shape: each
        token attends causally to its sequence's cached keys (the step's are stored
        first), the last ``sliding_window`` of them when set."""
