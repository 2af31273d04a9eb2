"""What rank 0 tells the other ranks, as tensors only.

Each message is a fixed header of int64 on the command group (what comes next and the
sizes of it), then at most one payload tensor on the device group:

- STEP: the step's block copies and its model inputs (token ids, positions, the
  attention layout, and the rows its images' embeddings take) in one int64 tensor, then
  those embeddings where it has images (rank 0 runs the vision tower); each rank copies
  its KV blocks and runs the forward pass, joining the model's collectives.
- LOGITS: hidden-state rows [n, hidden] whose logits rank 0 needs (for sampling, or for
  prompt logprobs); each rank computes its vocabulary's share of them, gathered.
- STOP: the worker leaves its loop.

The header's size never changes, so a worker can always receive the next one; the
payloads' sizes are in the header.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

import torch
from hetero_infer.engine.core.step_data import BlockMoves, SchedulerOutput
from hetero_infer.engine.distributed.process_group import TensorParallelGroup
from hetero_infer.kernels import AttentionInputs


class Command(enum.IntEnum):
    STOP = 0
    STEP = 1
    LOGITS = 2


# The command, the step's five sizes, its KV cache groups and three copy counts in each
# of up to three groups, then its positions' rows (M-RoPE's 3), whether it has
# bidirectional_ends, and its image rows and their width.
HEADER_SIZE = 24


@dataclass
class Step:
    """A step as a worker receives it: the block copies and the forward pass's inputs."""

    copies: SchedulerOutput  # only its block copies (blocks_to_*, later_group_moves) are set
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens], or M-RoPE's [3, num_tokens]
    attention_inputs: AttentionInputs
    # The image embeddings' token rows [n] and the embeddings [n, hidden] (ImageEmbeds).
    image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None


class StepSender:
    """Rank 0's side."""

    def __init__(self, tp: TensorParallelGroup) -> None:
        self.tp = tp

    def send_step(
        self,
        out: SchedulerOutput,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionInputs,
        image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        num_tokens = input_ids.shape[0]
        ends = attention.bidirectional_ends
        image_rows, embeddings = image_embeds if image_embeds is not None else (None, None)
        num_seqs, max_blocks = attention.block_tables.shape
        groups = (attention, *attention.later_groups)  # per KV cache group, by index
        copies = []
        for group in range(len(groups)):
            moves = out.group_moves(group)
            copies += [moves.swap_out, moves.swap_in, moves.copy]
        self._send_header(
            Command.STEP,
            num_tokens,
            num_seqs,
            max_blocks,
            attention.max_query_len,
            attention.max_context_len,
            len(groups),
            *(len(pairs) for pairs in copies),
            positions.numel() // num_tokens,
            ends is not None,
            *((0, 0) if embeddings is None else embeddings.shape),
        )
        device = input_ids.device
        pairs = [p for pairs in copies for pair in pairs for p in pair]
        parts = [
            torch.tensor(pairs, dtype=torch.long).to(device),
            input_ids,
            positions.flatten(),
            attention.context_lens.long(),
            attention.query_start_loc.long(),
            *([] if ends is None else [ends.long()]),
            *([] if image_rows is None else [image_rows.long()]),
        ]
        for group in groups:
            parts += [group.slot_mapping, group.block_tables.flatten().long()]
        self.tp.broadcast(torch.cat(parts))
        if embeddings is not None:
            self.tp.broadcast(embeddings.contiguous())

    def send_logits(self, hidden: torch.Tensor) -> None:
        """Ask for the logits of ``hidden`` [n, hidden]: call before compute_logits."""
        self._send_header(Command.LOGITS, *hidden.shape)
        self.tp.broadcast(hidden.contiguous())

    def send_stop(self) -> None:
        self._send_header(Command.STOP)

    def _send_header(self, command: Command, *sizes: int) -> None:
        header = torch.zeros(HEADER_SIZE, dtype=torch.long)
        header[0] = command
        header[1 : 1 + len(sizes)] = torch.tensor(sizes, dtype=torch.long)
        self.tp.broadcast_command(header)


class StepReceiver:
    """A worker's side: ``receive`` returns (command, Step or hidden rows or None)."""

    def __init__(self, tp: TensorParallelGroup, hidden_dtype: torch.dtype) -> None:
        self.tp = tp
        self.hidden_dtype = hidden_dtype

    def receive(self) -> tuple[Command, Step | torch.Tensor | None]:
        header = self.tp.broadcast_command(torch.zeros(HEADER_SIZE, dtype=torch.long))
        command, *sizes = header.tolist()
        if command == Command.STEP:
            return Command.STEP, self._receive_step(sizes)
        if command == Command.LOGITS:
            rows, hidden_size = sizes[:2]
            hidden = torch.empty(
                (rows, hidden_size), dtype=self.hidden_dtype, device=self.tp.device
            )
            return Command.LOGITS, self.tp.broadcast(hidden)
        return Command(command), None

    def _receive_step(self, sizes: list[int]) -> Step:
        num_tokens, num_seqs, max_blocks, max_query_len, max_context_len, num_groups = sizes[:6]
        num_copies = sizes[6 : 6 + 3 * num_groups]
        position_rows, has_ends, image_rows, width = sizes[6 + 3 * num_groups : 10 + 3 * num_groups]
        lengths = [2 * sum(num_copies), num_tokens, position_rows * num_tokens, num_seqs]
        lengths += [num_seqs + 1, num_tokens * has_ends, image_rows]
        lengths += [num_tokens, num_seqs * max_blocks] * num_groups
        payload = torch.empty(sum(lengths), dtype=torch.long, device=self.tp.device)
        pair_list, input_ids, positions, lens, starts, ends, rows, *tables = self.tp.broadcast(
            payload
        ).split(lengths)
        image_embeds = None
        if image_rows:
            embeddings = torch.empty(
                (image_rows, width), dtype=self.hidden_dtype, device=self.tp.device
            )
            image_embeds = (rows, self.tp.broadcast(embeddings))
        pairs = [
            [(src, dst) for src, dst in t.view(-1, 2).tolist()]
            for t in pair_list.split([2 * n for n in num_copies])
        ]
        groups = [
            AttentionInputs(
                slot_mapping=slots,
                block_tables=group_tables.view(num_seqs, max_blocks).int(),
                context_lens=lens.int(),
                query_start_loc=starts.int(),
                max_query_len=max_query_len,
                max_context_len=max_context_len,
                bidirectional_ends=ends if has_ends else None,
            )
            for slots, group_tables in zip(tables[::2], tables[1::2], strict=True)
        ]
        attention = replace(groups[0], later_groups=tuple(groups[1:]))
        copies = SchedulerOutput(
            blocks_to_swap_out=pairs[0],
            blocks_to_swap_in=pairs[1],
            blocks_to_copy=pairs[2],
            later_group_moves=[BlockMoves(*pairs[i : i + 3]) for i in range(3, len(pairs), 3)],
        )
        if position_rows > 1:
            positions = positions.view(position_rows, num_tokens)
        return Step(copies, input_ids, positions, attention, image_embeds)
