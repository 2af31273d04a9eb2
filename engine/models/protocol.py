"""CausalLM: what the model runner needs of a model, whatever its architecture."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.kernels import AttentionInputs, DecoderStackSpec, Kernels

# One layer's (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim].
KVCache = tuple[torch.Tensor, torch.Tensor]
# A step's image embeddings: the token rows they replace [n], and the rows [n, hidden].
ImageEmbeds = tuple[torch.Tensor, torch.Tensor]


class TensorParallel(Protocol):
    """What a model needs of its tensor-parallel group (engine/distributed/
    process_group.py's TensorParallelGroup is one): its place in the group, and the
    collectives between its layers."""

    rank: int
    world_size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...

    def all_gather(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class CausalLM(Protocol):
    """A decoder over a paged KV cache: one call computes every scheduled token of a
    step. Implementations are torch modules, built on the meta device and then filled
    by load_weights, so a model never initializes weights it is about to overwrite."""

    config: ModelConfig
    # What it calls, chosen before it was built; the runner prepares each step's
    # attention metadata with the same backend.
    kernels: Kernels
    num_layers: int
    num_kv_heads: int
    head_dim: int
    # The distinct attention windows of the layers (None = full attention): the
    # attention kernels prepare one mask per window.
    sliding_windows: set[int | None]
    # LongRoPE: the context past which a sequence takes the long factors, whose RoPE
    # table rows follow the short ones' (None: the model has one set).
    long_rope_after: int | None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionInputs,
        image_embeds: ImageEmbeds | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [num_tokens] -> final hidden states [num_tokens, hidden];
        ``image_embeds`` in place of the embeddings of the tokens they name."""
        ...

    # The runner calls the model itself: a torch module's call runs its hooks, then forward.
    __call__ = forward

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden] -> logits [n, vocab] in the model's dtype."""
        ...

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Fill every parameter from Hugging Face-named tensors; ConfigError for a
        missing, unknown or misshapen one."""
        ...

    def pack_weights(self, place: Callable[[list[Any]], None] | None = None) -> None:
        """Prepare the linear layers' weights for their kernels, once, after
        load_weights (on the CPU: packed bf16 copies); ``place`` puts the packed
        tensors where the loader wants them, in the order a step reads them."""
        ...

    def embed(
        self, input_ids: torch.Tensor, image_embeds: ImageEmbeds | None = None
    ) -> torch.Tensor:
        """input_ids [num_tokens] -> the embeddings [num_tokens, hidden]."""
        ...

    def encode_images(self, pixel_values: list[torch.Tensor]) -> torch.Tensor:
        """A vision model's images (each one's pixel values as its processor made them:
        ImageInput.pixel_values) -> the embeddings of their placeholder tokens [rows,
        hidden], the images' in order; a text model has none (the input processor
        refuses images before they get here)."""
        ...

    def final_norm(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The last layer's output and the residual stream -> the final hidden states."""
        ...

    def decoder_stack_spec(self) -> DecoderStackSpec:
        """The layers as the kernels' one-call decoder stack takes them (after packing)."""
        ...

    def init_rope(self, device: torch.device) -> None:
        """Build the RoPE tables on `device` (they are not parameters)."""
        ...
