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


HEADER_SIZE = 14


@dataclass
class Step:
    """A step as a worker receives it: the block copies and the forward pass's inputs."""

    copies: SchedulerOutput  # only its block copies (blocks_to_*, sliding_moves) are set
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
        moves = out.sliding_moves
        copies = [out.blocks_to_swap_out, out.blocks_to_swap_in, out.blocks_to_copy]
        copies += [moves.swap_out, moves.swap_in, moves.copy]
        sliding = attention.sliding
        self._send_header(
            Command.STEP,
            num_tokens,
            num_seqs,
            max_blocks,
            attention.max_query_len,
            attention.max_context_len,
            sliding is not None,
            *(len(pairs) for pairs in copies),
        )
        device = input_ids.device
        pairs = [p for pairs in copies for pair in pairs for p in pair]
        parts = [
            torch.tensor(pairs, dtype=torch.long).to(device),
            input_ids,
            positions,
            attention.slot_mapping,
            attention.block_tables.flatten().long(),
            attention.context_lens.long(),
            attention.query_start_loc.long(),
        ]
        if sliding is not None:  # the sliding-window layers' own tables
            parts += [sliding.slot_mapping, sliding.block_tables.flatten().long()]
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
        num_tokens, num_seqs, max_blocks, max_query_len, max_context_len = sizes[:5]
        has_sliding = bool(sizes[5])
        num_copies = sizes[6:12]
        lengths = [2 * n for n in num_copies] + [num_tokens] * 3
        lengths += [num_seqs * max_blocks, num_seqs, num_seqs + 1]
        if has_sliding:
            lengths += [num_tokens, num_seqs * max_blocks]
        payload = torch.empty(sum(lengths), dtype=torch.long, device=self.tp.device)
        parts = self.tp.broadcast(payload).split(lengths)
        pairs = [[(src, dst) for src, dst in t.view(-1, 2).tolist()] for t in parts[:6]]
        input_ids, positions, slots, tables, lens, starts = parts[6:12]
        attention = AttentionInputs(
            slot_mapping=slots,
            block_tables=tables.view(num_seqs, max_blocks).int(),
            context_lens=lens.int(),
            query_start_loc=starts.int(),
            max_query_len=max_query_len,
            max_context_len=max_context_len,
        )
        if has_sliding:
            sliding_slots, sliding_tables = parts[12:]
            sliding = replace(
                attention,
                slot_mapping=sliding_slots,
                block_tables=sliding_tables.view(num_seqs, max_blocks).int(),
            )
            attention = replace(attention, sliding=sliding)
        copies = SchedulerOutput(
            blocks_to_swap_out=pairs[0],
            blocks_to_swap_in=pairs[1],
            blocks_to_copy=pairs[2],
            sliding_moves=BlockMoves(*pairs[3:]),
        )
        return Step(copies, input_ids, positions, attention)
