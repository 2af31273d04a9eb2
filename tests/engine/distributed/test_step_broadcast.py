"""A step crosses to the other ranks as tensors and arrives whole: block copies, token
ids, positions and the attention layout, then hidden rows for logits, then STOP. The
group here is a loopback that hands each broadcast tensor to the receiving side."""

from __future__ import annotations

from collections import deque

import pytest
import torch
from hetero_infer.engine.core.step_data import BlockMoves, SchedulerOutput
from hetero_infer.engine.distributed.step_broadcast import (
    Command,
    Step,
    StepReceiver,
    StepSender,
)
from hetero_infer.engine.worker.input_batch import Chunk, InputBatcher
from hetero_infer.kernels import select_kernels


class Loopback:
    """Rank 0's broadcasts queued; a receiving rank's broadcasts take them in order,
    checking that both sides agree on each tensor's shape and dtype, as a real group
    needs."""

    rank, world_size, device = 0, 2, torch.device("cpu")

    def __init__(self) -> None:
        self.commands: deque[torch.Tensor] = deque()
        self.payloads: deque[torch.Tensor] = deque()

    def broadcast_command(self, x: torch.Tensor) -> torch.Tensor:
        return self._pass(self.commands, x)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        return self._pass(self.payloads, x)

    def _pass(self, queue: deque[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        if self.rank == 0:
            queue.append(x.clone())
            return x
        sent = queue.popleft()
        assert (sent.shape, sent.dtype) == (x.shape, x.dtype)
        return x.copy_(sent)


@pytest.mark.parametrize("num_groups", [1, 2])
def test_a_step_then_logits_then_stop_arrive_whole(num_groups: int):
    """With a second KV cache group (a sliding-window layers' own), its tables, slots
    and copies arrive as its own."""
    group = Loopback()
    sender, receiver = StepSender(group), StepReceiver(group, torch.float32)
    kernels = select_kernels("torch", torch.device("cpu"), cpu_kernels=False)
    batcher = InputBatcher(4, torch.device("cpu"), kernels.attention, {None, 4}, num_groups)
    second = [[8], [0, 6], [0, 5]]  # the second group's tables, where there is one
    chunks = [
        Chunk([5, 6, 7], 0, [[3], second[0]], True),
        Chunk([9], 6, [[1, 4], second[1]], True),
        Chunk([8] * 6, 2, [[0, 2], second[2]], False),
    ]
    inputs = batcher.build(chunks)
    later_moves = [BlockMoves([(7, 3)], [], [(5, 9)])] * (num_groups - 1)
    out = SchedulerOutput(
        blocks_to_swap_out=[(5, 0), (6, 1)],
        blocks_to_swap_in=[(2, 7)],
        blocks_to_copy=[],
        later_group_moves=later_moves,
    )
    hidden = torch.randn(2, 12)
    sender.send_step(out, inputs.input_ids, inputs.positions, inputs.meta)
    sender.send_logits(hidden)
    sender.send_stop()

    group.rank = 1
    command, step = receiver.receive()
    assert command == Command.STEP and isinstance(step, Step)
    assert step.copies.blocks_to_swap_out == [(5, 0), (6, 1)]
    assert step.copies.blocks_to_swap_in == [(2, 7)] and step.copies.blocks_to_copy == []
    assert torch.equal(step.input_ids, inputs.input_ids)
    assert torch.equal(step.positions, inputs.positions)
    assert step.copies.later_group_moves == later_moves
    sent, got = inputs.meta, step.attention_inputs
    assert len(got.later_groups) == len(sent.later_groups) == num_groups - 1
    groups = zip((sent, *sent.later_groups), (got, *got.later_groups), strict=True)
    for sent_group, got_group in groups:
        for name in ("slot_mapping", "block_tables", "context_lens", "query_start_loc"):
            assert getattr(got_group, name).dtype == getattr(sent_group, name).dtype, name
            assert torch.equal(getattr(got_group, name), getattr(sent_group, name)), name
    assert (got.max_query_len, got.max_context_len) == (sent.max_query_len, sent.max_context_len)
    if num_groups == 2:
        assert got.later_groups[0].block_tables[1].tolist() == [0, 6]

    command, rows = receiver.receive()
    assert command == Command.LOGITS and torch.equal(rows, hidden)
    assert receiver.receive() == (Command.STOP, None)
    assert not group.commands and not group.payloads
