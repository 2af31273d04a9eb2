"""A step's model inputs: the scheduled chunks packed into tensors.

This is the one place where the scheduler's Python lists become tensors: token ids,
positions, slot mapping, block tables and context lengths, in one pass of numpy over
all tokens (a Python loop runs per sequence, for its token ids and block table, never
per token), handed to torch without copies on the CPU; the attention backend then
makes its own metadata of them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import torch
from hetero_infer.engine.lora import step_groups
from hetero_infer.engine.models.protocol import ImageEmbeds
from hetero_infer.engine.params.image_input import ImageInput
from hetero_infer.engine.worker.image_embeddings import (
    ImagePlacement,
    bidirectional_ends,
    place_images,
)
from hetero_infer.engine.worker.mrope_positions import mrope_positions
from hetero_infer.kernels import AttentionBackend, AttentionInputs, torch_attention

# The backend of a step whose image tokens see each other both ways (Gemma 3's prefill).
TORCH_ATTENTION = torch_attention()


class Chunk(NamedTuple):
    """One sequence's share of a step."""

    token_ids: list[int]  # the tokens computed
    start: int  # the position of the first
    block_tables: list[list[int]]  # per KV cache group (engine/models/kv_layout.py)
    samples: bool  # whether its last token's logits are kept for sampling
    # Draft tokens at the end of token_ids: their logits are kept too (speculative
    # decoding verifies them), the last 1 + num_draft_tokens positions' in all.
    num_draft_tokens: int = 0
    # Added to its positions for the RoPE table rows its tokens take (LongRoPE's long
    # factors follow the short ones in the tables).
    rope_offset: int = 0
    lora_slot: int = 0  # the LoRA adapter its rows take (0: none)
    # Its images with placeholder tokens among token_ids (their embeddings go there).
    images: tuple[ImageInput, ...] = ()


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]: the RoPE table rows (positions, offset)
    meta: Any  # the attention backend's metadata for the step
    # [num_logit_rows]: the last token of each sampling sequence (its last 1 + drafts
    # tokens where it has draft tokens), in order
    logits_indices: torch.Tensor
    # The rows of each LoRA adapter the step uses (engine/lora/model_lora.py): [] where
    # every row runs the base model.
    lora_groups: list = field(default_factory=list)
    # Which image embedding rows replace which tokens' (image_embeddings.py), and those
    # rows once the runner has them.
    image_placements: list[ImagePlacement] = field(default_factory=list)
    image_embeds: ImageEmbeds | None = None


class InputBatcher:
    def __init__(
        self,
        block_size: int,
        device: torch.device,
        attention: AttentionBackend,
        sliding_windows: set[int | None],
        num_kv_groups: int = 1,
    ) -> None:
        """``num_kv_groups``: the KV cache groups whose block tables the chunks carry."""
        self.block_size = block_size
        self.device = device
        self.attention = attention
        self.sliding_windows = sliding_windows
        self.num_kv_groups = num_kv_groups

    def build(self, chunks: list[Chunk]) -> ModelInputs:
        bs = self.block_size
        num_seqs = len(chunks)
        query_lens = np.fromiter((len(c.token_ids) for c in chunks), np.int64, num_seqs)
        starts = np.fromiter((c.start for c in chunks), np.int64, num_seqs)
        query_start_loc = np.zeros(num_seqs + 1, np.int64)
        np.cumsum(query_lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        input_ids = np.fromiter(
            itertools.chain.from_iterable(c.token_ids for c in chunks), np.int64
        )
        # The sequence each token belongs to, and its absolute position there.
        token_seq = np.repeat(np.arange(num_seqs), query_lens)
        positions = np.arange(num_tokens) - (query_start_loc[:-1] - starts)[token_seq]
        context_lens = starts + query_lens
        max_context_len = int(context_lens.max())
        max_blocks = -(-max_context_len // bs)
        # Each group's tables, and each token's cache slot in them.
        groups = [
            self._tables([c.block_tables[g] for c in chunks], token_seq, positions, max_blocks)
            for g in range(self.num_kv_groups)
        ]
        num_rows = np.fromiter(
            (1 + c.num_draft_tokens if c.samples else 0 for c in chunks), np.int64, num_seqs
        )
        # Row r belongs to sequence row_seq[r]; its rows are that sequence's last tokens.
        row_seq = np.repeat(np.arange(num_seqs), num_rows)
        first_row = np.cumsum(num_rows) - num_rows
        row_in_seq = np.arange(int(num_rows.sum())) - first_row[row_seq]
        logits_indices = query_start_loc[1:][row_seq] - num_rows[row_seq] + row_in_seq

        image_placements = [
            placement
            for c, first_row in zip(chunks, query_start_loc, strict=False)
            if c.images
            for placement in place_images(
                c.images, c.start, c.start + len(c.token_ids) - c.num_draft_tokens, first_row
            )
        ]
        ends = bidirectional_ends(image_placements, num_tokens)

        (block_tables, slot_mapping), *later = groups
        attention_inputs = AttentionInputs(
            slot_mapping=self._tensor(slot_mapping),
            block_tables=self._tensor(block_tables, torch.int32),
            context_lens=self._tensor(context_lens, torch.int32),
            query_start_loc=self._tensor(query_start_loc, torch.int32),
            max_query_len=int(query_lens.max()),
            max_context_len=max_context_len,
            bidirectional_ends=None if ends is None else self._tensor(ends),
        )
        if later:  # the same step over each later group's tables
            attention_inputs = replace(
                attention_inputs,
                later_groups=tuple(
                    replace(
                        attention_inputs,
                        slot_mapping=self._tensor(slots),
                        block_tables=self._tensor(tables, torch.int32),
                    )
                    for tables, slots in later
                ),
            )
        rope_offsets = np.fromiter((c.rope_offset for c in chunks), np.int64, num_seqs)
        lora_slots = np.fromiter((c.lora_slot for c in chunks), np.int64, num_seqs)
        lora_groups = []
        if lora_slots.any():
            lora_groups = step_groups(lora_slots[token_seq], self.device)
        positions = positions + rope_offsets[token_seq]
        if any(c.images and c.images[0].grid is not None for c in chunks):
            positions = self._mrope(chunks, positions, query_start_loc, bool(image_placements))
        return ModelInputs(
            input_ids=self._tensor(input_ids),
            positions=self._tensor(positions),
            meta=self.prepare(attention_inputs),
            logits_indices=self._tensor(logits_indices),
            lora_groups=lora_groups,
            image_placements=image_placements,
        )

    def prepare(self, inputs: AttentionInputs) -> Any:
        """The step's metadata by its backend, built once for every layer: the torch
        reference's where tokens see keys past their own, which no kernel does."""
        attention = self.attention if inputs.bidirectional_ends is None else TORCH_ATTENTION
        return attention.prepare_step(inputs, self.block_size, self.sliding_windows)

    def _mrope(
        self,
        chunks: list[Chunk],
        positions: np.ndarray,
        query_start_loc: np.ndarray,
        image_tokens: bool,
    ) -> np.ndarray:
        """M-RoPE's positions (worker/mrope_positions.py): [3, num_tokens] where the step
        has image tokens, else the one row all three are."""
        rows = np.tile(positions, (3, 1))
        for c, first in zip(chunks, query_start_loc, strict=False):
            if c.images and c.images[0].grid is not None:
                end = c.start + len(c.token_ids)
                rows[:, first : first + len(c.token_ids)] = mrope_positions(c.images, c.start, end)
        return rows if image_tokens else rows[0]

    def _tables(
        self, tables: list[list[int]], token_seq: np.ndarray, positions: np.ndarray, max_blocks: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The block tables as one padded array, and each token's cache slot in them."""
        bs = self.block_size
        block_tables = np.zeros((len(tables), max_blocks), np.int32)
        for row, table in zip(block_tables, tables, strict=True):
            used = table[:max_blocks]
            row[: len(used)] = used
        slot_mapping = block_tables[token_seq, positions // bs].astype(np.int64) * bs
        slot_mapping += positions % bs
        return block_tables, slot_mapping

    def synthetic(self, lengths: list[tuple[int, int]]) -> ModelInputs:
        """Inputs for made-up sequences, one per (cached tokens, new tokens), on blocks
        0, 1, 2, ... in order, in each KV cache group (for profiling, warm-up and checks;
        token ids are 0)."""
        chunks: list[Chunk] = []
        next_block = 0
        for cached, new in lengths:
            num_blocks = -(-(cached + new) // self.block_size)
            table = list(range(next_block, next_block + num_blocks))
            next_block += num_blocks
            chunks.append(Chunk([0] * new, cached, [table] * self.num_kv_groups, True))
        return self.build(chunks)

    def _tensor(self, values: np.ndarray, dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.from_numpy(values).to(self.device, dtype, non_blocking=True)
