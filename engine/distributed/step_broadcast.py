"""What rank 0 tells the other ranks, as tensors only.

Each message is a fixed header of int64 on the command group (what comes next and the
sizes of it), then at most one payload tensor on the device group:

- STEP: the step's block copies and its model inputs (token ids, positions and the
  attention layout) in one int64 tensor; each rank copies its KV blocks and runs the
  forward pass, joining the model's collectives.
- LOGITS: hidden-state rows [n, hidden] whose logits rank 0 needs (for sampling, or for
  prompt logprobs); each rank computes its vocabulary's share of them, gathered.
- STOP: the worker leaves its loop.

The header's size never changes, so a worker can always receive the next one; the
payload's size is in the header.
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
# of up to three groups.
HEADER_SIZE = 16


@dataclass
class Step:
    """A step as a worker receives it: the block copies and the forward pass's inputs."""

    copies: SchedulerOutput  # only its block copies (blocks_to_*, later_group_moves) are set
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    attention_inputs: AttentionInputs


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
    ) -> None:
        num_tokens = input_ids.shape[0]
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
        )
        device = input_ids.device
        pairs = [p for pairs in copies for pair in pairs for p in pair]
        parts = [
            torch.tensor(pairs, dtype=torch.long).to(device),
            input_ids,
            positions,
            attention.context_lens.long(),
            attention.query_start_loc.long(),
        ]
        for group in groups:
            parts += [group.slot_mapping, group.block_tables.flatten().long()]
        self.tp.broadcast(torch.cat(parts))

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
        lengths = [2 * sum(num_copies), num_tokens, num_tokens, num_seqs, num_seqs + 1]
        lengths += [num_tokens, num_seqs * max_blocks] * num_groups
        payload = torch.empty(sum(lengths), dtype=torch.long, device=self.tp.device)
        pair_list, input_ids, positions, lens, starts, *tables = self.tp.broadcast(payload).split(
            lengths
        )
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
        return Step(copies, input_ids, positions, attention)
