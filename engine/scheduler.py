"""Token-budget continuous batching with chunked prefill and preemption.

Each step gets at most ``max_num_batched_tokens`` tokens. Running sequences go
first (a decode costs one token, an unfinished prefill the rest of its prompt,
cut to the budget), then swapped-out sequences come back, then waiting ones are
admitted while blocks, the budget, ``max_num_seqs`` and the ``memory_threshold``
watermark allow. When a running sequence cannot get a block, the newest running
sequence is preempted: its KV is dropped and recomputed later, or swapped to CPU
blocks when there is swap space. No torch here.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from hetero_infer.engine.block_manager import BlockManager
from hetero_infer.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int

    @property
    def start(self) -> int:
        """Position of the first token computed this step."""
        return self.seq.num_computed_tokens

    @property
    def samples(self) -> bool:
        """Whether this step reaches the sequence's last token, so a token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    # Block copies the model runner does before the forward pass, in this order.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # gpu -> cpu
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # cpu -> gpu
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # gpu -> gpu
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        memory_threshold: float = 1.0,
        use_swap: bool = False,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.memory_threshold = memory_threshold
        self.use_swap = use_swap
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    # ---- scheduling ----

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        if out.preempted:
            return out  # memory is short: admit nothing new this step
        budget = self._schedule_swapped(out, budget)
        if not self.swapped:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        bm = self.block_manager
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_uncomputed_tokens, budget)
            while not bm.can_allocate_slots(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    return budget
            out.blocks_to_copy += bm.allocate_slots(seq, num_new)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            budget -= num_new
            i += 1
        return budget

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        bm = self.block_manager
        while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.swapped[0]
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not bm.can_swap_in(seq, num_new):
                break
            self.swapped.popleft()
            out.blocks_to_swap_in += bm.swap_in(seq)
            out.blocks_to_copy += bm.allocate_slots(seq, num_new)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            budget -= num_new
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            num_hit = bm.allocate_cached_prefix(seq)
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self._can_admit(seq, num_new):
                bm.free(seq)
                seq.num_computed_tokens = 0
                break
            self.waiting.popleft()
            bm.record_prefix_lookup(seq.num_tokens, num_hit)
            out.blocks_to_copy += bm.allocate_slots(seq, num_new)
            seq.status = SequenceStatus.RUNNING
            if seq.times.first_scheduled is None:
                seq.times.first_scheduled = time.monotonic()
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            budget -= num_new

    def _can_admit(self, seq: Sequence, num_new_tokens: int) -> bool:
        bm = self.block_manager
        needed = bm.num_blocks_needed(seq, num_new_tokens)
        if needed > bm.num_free_blocks:
            return False
        if not self.running:
            return True  # the watermark must never starve a lone request
        return bm.num_used_blocks + needed <= self.memory_threshold * bm.num_blocks

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.num_preemptions += 1
        seq.num_preemptions += 1
        out.preempted.append(seq)
        if self.use_swap and self.block_manager.can_swap_out(seq):
            out.blocks_to_swap_out += self.block_manager.swap_out(seq)
            seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(seq)
        else:
            self.block_manager.free(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)

    # ---- after the model step ----

    def postprocess(self, out: SchedulerOutput, sampled: dict[str, tuple]) -> list[Sequence]:
        """Advance the scheduled sequences; append sampled tokens; finish and free.

        ``sampled`` maps request_id -> (token_id, logprob[, top logprobs]) for each
        sequence that sampled this step. Returns the sequences that made progress.
        """
        progressed = []
        for item in out.scheduled:
            seq = item.seq
            if seq.is_finished:  # aborted while the step ran
                continue
            seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.register_full_blocks(seq)
            if seq.request_id in sampled:
                if seq.fork_children:
                    self._fork_children(seq)
                token_id, logprob, *top = sampled[seq.request_id]
                seq.append_token(token_id, logprob, top[0] if top else None)
                self._check_stop(seq, token_id)
            if seq.is_finished:
                self._free_finished(seq)
            progressed.append(seq)
        return progressed

    def _fork_children(self, parent: Sequence) -> None:
        """n > 1: the other choices start from the parent's computed prompt.

        Each shares the blocks of all but the last prompt token and computes that one
        itself next step, so its first token is sampled from its own logits and
        generator; the partly filled block they share is copied on write.
        """
        assert parent.num_output_tokens == 0 and parent.num_computed_tokens == parent.num_tokens
        for child in parent.fork_children:
            if child.is_finished:  # aborted with its group
                continue
            self.block_manager.fork(parent, child, parent.num_tokens - 1)
            child.prompt_logprobs = parent.prompt_logprobs  # complete now, and never changes
            child.status = SequenceStatus.RUNNING
            child.times.first_scheduled = parent.times.first_scheduled
            self.running.append(child)
        parent.fork_children = []

    def _check_stop(self, seq: Sequence, token_id: int) -> None:
        params = seq.sampling_params
        may_stop = seq.num_output_tokens >= params.min_tokens
        if may_stop and not params.ignore_eos and token_id in seq.eos_token_ids:
            seq.status = SequenceStatus.FINISHED_STOPPED
        elif may_stop and token_id in params.stop_token_ids:
            seq.status = SequenceStatus.FINISHED_STOPPED
            seq.stop_reason = token_id
        elif seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            seq.status = SequenceStatus.FINISHED_LENGTH

    def _free_finished(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.times.finished = time.monotonic()

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """End a sequence wherever it is (abort, failure) and free its blocks."""
        assert status.is_finished
        if seq.is_finished:
            return
        if seq in self.running:
            self.running.remove(seq)
            self.block_manager.free(seq)
        elif seq in self.swapped:
            self.swapped.remove(seq)
            self.block_manager.free_swapped(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
            self.block_manager.free(seq)
        seq.status = status
        seq.times.finished = time.monotonic()
