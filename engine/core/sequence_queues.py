"""The queues a sequence lives in while unfinished (waiting, running, swapped), in the
scheduling policy's order, and how it leaves them: finished (a stop, an abort, a
failure), timed out, or rejected before it started. The Scheduler (scheduler.py)
holds them and decides, each step, which of them move; the engine core adds and ends
sequences here.
"""

from __future__ import annotations

import bisect
import time
from collections import deque

from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.sequence import Sequence, SequenceStatus
from hetero_infer.engine.core.step_data import SequenceUpdate
from hetero_infer.engine.core.step_records import sequence_update
from hetero_infer.engine.settings.choices import SCHEDULING_POLICIES


def priority_key(seq: Sequence) -> tuple[int, float]:
    """The priority policy's order: lower value first, then earlier arrival."""
    return (seq.priority, seq.arrival_time)


def slots_needed(seq: Sequence) -> int:
    """The running slots a sequence takes: itself and its n > 1 choices still to fork
    (they join it as it samples its first token)."""
    return 1 + sum(not child.is_finished for child in seq.fork_children)


class SequenceQueues:
    def __init__(self, block_manager: BlockManager, policy: str) -> None:
        assert policy in SCHEDULING_POLICIES, policy
        self.block_manager = block_manager
        self.policy = policy
        # Every unfinished sequence by id (n > 1 choices waiting to fork included).
        self.sequences: dict[str, Sequence] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self._finished_ids: list[str] = []  # since the last schedule()

    def add(self, seq: Sequence) -> None:
        """Queue a sequence; its fork_children (n > 1) join once its prompt is computed."""
        for s in (seq, *seq.fork_children):
            self.sequences[s.request_id] = s
        self.enqueue(seq, preempted=False)

    def enqueue(self, seq: Sequence, preempted: bool) -> None:
        """Queue a new or preempted sequence: by arrival (a preempted one goes first,
        it arrived before the waiting ones), or in the priority policy's order."""
        if self.policy == "priority":
            index = bisect.bisect_right(self.waiting, priority_key(seq), key=priority_key)
            self.waiting.insert(index, seq)
        elif preempted:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def outranking(self, seq: Sequence) -> Sequence | None:
        """Under the priority policy, the running sequence to preempt so that ``seq``
        can start: the lowest-priority one, if its value is higher than ``seq``'s (equal
        priorities never preempt each other, which would only trade places)."""
        if self.policy != "priority" or not self.running:
            return None
        victim = max(self.running, key=priority_key)
        return victim if victim.priority > seq.priority else None

    def has_slots(self, seq: Sequence, max_num_seqs: int) -> bool:
        """Whether max_num_seqs leaves room to run the sequence and its n > 1 choices
        still to fork, beside the running ones and theirs (vLLM counts a request's n when
        it admits it). A request alone may take more: it could never start otherwise."""
        if not self.running:
            return True
        room = max_num_seqs - len(self.running) - slots_needed(seq)
        # (The running set full, as under load, is answered without the walk.)
        return room >= 0 and room >= sum(
            slots_needed(s) - 1 for s in self.running if s.fork_children
        )

    def take_finished_ids(self) -> list[str]:
        """The sequences finished since the last call (the runner drops their state)."""
        finished, self._finished_ids = self._finished_ids, []
        return finished

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def counts(self) -> dict[str, int]:
        """The unfinished sequences, and those in each queue (LLMEngine.memory_stats)."""
        return {
            "num_sequences": self.num_unfinished,
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            "num_swapped": len(self.swapped),
        }

    def time_out(self, request_id: str, now: float) -> SequenceUpdate | None:
        """End a sequence whose deadline has passed: "length" once it has output tokens
        (what it has is the answer, cut short as by max_tokens), "abort" before its
        first. Returns its update for the front end; None if the sequence is not
        unfinished or its deadline is still ahead."""
        seq = self.sequences.get(request_id)
        if seq is None or seq.deadline is None or seq.deadline > now:
            return None
        if seq.num_output_tokens > seq.num_pending_tokens:
            self.finish(request_id, SequenceStatus.FINISHED_LENGTH)
        else:
            self.finish(request_id, SequenceStatus.FINISHED_ABORTED)
        return sequence_update(seq, [], [])

    def reject_unstarted(self, seq_ids: list[str]) -> list[SequenceUpdate]:
        """End a request's sequences (its choices) as rejected if none of them has been
        scheduled yet (max_queue_time). Returns their updates; none if the request has
        started or ended."""
        seqs = [self.sequences.get(seq_id) for seq_id in seq_ids]
        if not seqs or any(s is None or s.first_scheduled_time is not None for s in seqs):
            return []
        for seq in seqs:
            self.finish(seq.request_id, SequenceStatus.FINISHED_REJECTED)
        return [sequence_update(seq, [], []) for seq in seqs]

    def start_forks(self, parent: Sequence) -> None:
        """n > 1: the other choices join the running ones, sharing the parent's computed
        prompt but for its last token, which each computes itself next step, to sample
        its first token from its own logits and generator (their shared partial block
        is copied on write). Called as the parent samples its first token."""
        assert parent.num_output_tokens == 0 and parent.num_computed_tokens == parent.num_tokens
        for child in parent.fork_children:
            if child.is_finished:  # aborted with its group
                continue
            self.block_manager.fork(parent, child, parent.num_tokens - 1)
            child.long_rope = parent.long_rope
            child.num_prompt_logprobs = parent.num_prompt_logprobs  # complete now
            child.status = SequenceStatus.RUNNING
            child.first_scheduled_time = parent.first_scheduled_time
            child.num_cached_tokens = parent.num_cached_tokens
            self.running.append(child)
        parent.fork_children = []

    def finish(self, request_id: str, status: SequenceStatus) -> None:
        """End a sequence wherever it is (a stop, an abort, a failure) and free its blocks;
        nothing if there is no such unfinished sequence (it ended already)."""
        assert status.is_finished
        seq = self.sequences.pop(request_id, None)
        if seq is None:
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
        seq.finished_time = time.monotonic()
        self._finished_ids.append(request_id)
