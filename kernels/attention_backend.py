"""What every attention backend takes and does: the step's layout in, its own metadata out.

The model runner builds one ``AttentionInputs`` per step (the layout of the step's
tokens over the paged cache); the backend chosen at start-up turns it, once for all
layers, into the metadata its kernels read (``prepare``), then each layer stores its new
keys and values (``store_kv``) and attends (``forward``). Each backend's metadata is a
subclass of ``AttentionInputs`` holding what that backend alone needs (the torch
reference's masks, the CPU kernels' per-token rows), so no backend carries another's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
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
    # The same step in each later KV cache group (1, 2, ...: e.g. the sliding-window
    # layers' own), over that group's block tables (slot_mapping and block_tables
    # differ, the rest is the same), as the backend's metadata too once prepared.
    later_groups: tuple[AttentionInputs, ...] = field(default=(), kw_only=True)
    # [num_tokens] long, where the step computes tokens of an image whose tokens attend to
    # each other both ways (Gemma 3's): for each such token, one past its image's last
    # position, the keys up to there visible to it besides the causal ones (the chunk
    # holds the rest of the image: the scheduler never ends a chunk inside one); 0 for
    # every other token. None: no such token. The torch reference serves such a step
    # (the kernels' forwards hand it over when given its metadata).
    bidirectional_ends: torch.Tensor | None = field(default=None, kw_only=True)

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]

    def for_group(self, group: int) -> AttentionInputs:
        """The metadata a layer of this KV cache group reads: a step over one group
        serves every layer (a draft model keeps one cache for all of its layers)."""
        if 0 < group <= len(self.later_groups):
            return self.later_groups[group - 1]
        return self

    def common_fields(self) -> dict[str, Any]:
        """The fields above by name, to build a backend's metadata subclass from them
        (``dataclasses.asdict`` would copy the tensors)."""
        return {f.name: getattr(self, f.name) for f in fields(AttentionInputs)}


Metadata = TypeVar("Metadata", bound=AttentionInputs)
Tensor = torch.Tensor


@dataclass(frozen=True)
class AttentionBackend(Generic[Metadata]):
    """Paged attention by one family of kernels, chosen once (kernels/selection.py).

    Each backend is its three kernels, which share one signature each across backends,
    so they are bound here as they are: a call is a plain function call.
    """

    name: str
    # (inputs, block_size, the sliding windows the layers use) -> the step's metadata,
    # built once for all layers.
    prepare: Callable[[AttentionInputs, int, set[int | None]], Metadata]
    # (key, value [num_tokens, num_kv_heads, head_dim], k_cache, v_cache
    # [num_blocks, block_size, num_kv_heads, head_dim], slot_mapping) -> None: writes the
    # keys and values into their cache slots; slot -1 is skipped.
    store_kv: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], None]
    # (query [num_tokens, num_heads, head_dim], k_cache, v_cache, meta, scale,
    # sliding_window, softcap) -> output of the query's shape: each token attends
    # causally to its sequence's cached keys (the step's are stored first), the last
    # sliding_window of them when it is not None; with a softcap (Gemma 2) the scaled
    # scores s become softcap * tanh(s / softcap) before the mask and the softmax.
    forward: Callable[[Tensor, Tensor, Tensor, Metadata, float, int | None, float | None], Tensor]
    # Whether the metadata is the inputs' own tensors, so that a CUDA graph captured over
    # static input buffers replays any later step that fits them.
    supports_cuda_graphs: bool = False

    def prepare_step(
        self, inputs: AttentionInputs, block_size: int, sliding_windows: set[int | None]
    ) -> Metadata:
        """``prepare`` for every KV cache group of the step: the later groups' metadata
        goes in the first one's ``later_groups``."""
        meta = self.prepare(inputs, block_size, sliding_windows)
        if not inputs.later_groups:
            return meta
        later = tuple(self.prepare(g, block_size, sliding_windows) for g in inputs.later_groups)
        return replace(meta, later_groups=later)
