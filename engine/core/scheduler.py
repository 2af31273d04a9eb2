"""Token-budget continuous batching with chunked prefill and preemption.

Each step gets at most ``max_num_batched_tokens`` tokens. Running sequences go
first (a decode costs one token, an unfinished prefill the rest of its prompt,
cut to the budget), then swapped-out sequences come back, then waiting ones are
admitted while blocks, the budget, ``max_num_seqs`` and the ``memory_threshold``
watermark allow. When a running sequence cannot get a block, the newest running
sequence is preempted: its KV is dropped and recomputed later, or swapped to CPU
blocks when there is swap space. No torch here.

Two policies order the work, as vLLM's ``--scheduling-policy``: "fcfs" (arrival order)
and "priority" (lower ``priority`` values first, ties by arrival). Under "priority" the
running sequences are kept best first, so the one preempted when blocks run out is the
lowest-priority one, and a waiting sequence that cannot start for want of blocks or of
a ``max_num_seqs`` slot preempts running ones of a lower priority (a higher value).

With a speculator (speculative decoding), decoding sequences get draft tokens from what
the step has left once everything else is scheduled: they ride in their sequence's
step as extra query tokens, within the budget, in free blocks only, so they never
displace another sequence's tokens nor preempt anyone (nor come in a step that had to
preempt). After the step, the slots of rejected drafts are given back
(``update_from_output``).
"""

from __future__ import annotations

import bisect
import time
from collections import deque

from hetero_infer.engine.choices import SCHEDULING_POLICIES
from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.sequence import Sequence, SequenceStatus
from hetero_infer.engine.core.speculator import Speculator
from hetero_infer.engine.core.step_data import (
    ModelRunnerOutput,
    SampledToken,
    ScheduledSequence,
    SchedulerOutput,
    SequenceUpdate,
)
from hetero_infer.engine.core.stop import banned_token_ids, check_stop


def priority_key(seq: Sequence) -> tuple[int, float]:
    """The priority policy's order: lower value first, then earlier arrival."""
    return (seq.priority, seq.arrival_time)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        memory_threshold: float = 1.0,
        use_swap: bool = False,
        policy: str = "fcfs",
        speculator: Speculator | None = None,
    ) -> None:
        assert policy in SCHEDULING_POLICIES, policy
        # A sequence preempted for a higher-priority one may have been scheduled in the
        # same step, after swap-ins: swapping it out then would overwrite their CPU
        # blocks before they are read, so the priority policy preempts by recompute.
        assert not (policy == "priority" and use_swap), "the priority policy recomputes"
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.memory_threshold = memory_threshold
        self.use_swap = use_swap
        self.policy = policy
        self.speculator = speculator
        # Every unfinished sequence by id (n > 1 choices waiting to fork included).
        self.sequences: dict[str, Sequence] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.num_preemptions = 0
        self._finished_ids: list[str] = []  # since the last schedule()

    def add(self, seq: Sequence) -> None:
        """Queue a sequence; its fork_children (n > 1) join once its prompt is computed."""
        for s in (seq, *seq.fork_children):
            self.sequences[s.request_id] = s
        self._to_waiting(seq, preempted=False)

    def _to_waiting(self, seq: Sequence, preempted: bool) -> None:
        """Queue a new or preempted sequence: by arrival (a preempted one goes first,
        it arrived before the waiting ones), or in the priority policy's order."""
        if self.policy == "priority":
            index = bisect.bisect_right(self.waiting, priority_key(seq), key=priority_key)
            self.waiting.insert(index, seq)
        elif preempted:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    # ---- scheduling ----

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished=self._finished_ids)
        self._finished_ids = []
        steps: list[tuple[Sequence, int]] = []  # (sequence, tokens it computes)
        budget = self.max_num_batched_tokens
        if self.policy == "priority":
            # Best first: they get the budget first, and running[-1] is the lowest.
            self.running.sort(key=priority_key)
        budget = self._schedule_running(out, steps, budget)
        drafts: dict[str, list[int]] = {}
        if not out.preempted:  # memory is short: admit nothing new this step
            budget = self._schedule_swapped(out, steps, budget)
            if not self.swapped:
                budget = self._schedule_waiting(out, steps, budget)
            if self.speculator is not None:
                drafts = self._schedule_drafts(out, steps, budget)
        draft_model = self.speculator is not None and self.speculator.uses_draft_model
        out.scheduled.extend(
            schedule_entry(seq, num_new, drafts.get(seq.request_id), draft_model)
            for seq, num_new in steps
        )
        return out

    def _schedule_running(
        self, out: SchedulerOutput, steps: list[tuple[Sequence, int]], budget: int
    ) -> int:
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
            out.blocks_to_copy.extend(bm.allocate_slots(seq, num_new))
            steps.append((seq, num_new))
            budget -= num_new
            i += 1
        return budget

    def _schedule_swapped(
        self, out: SchedulerOutput, steps: list[tuple[Sequence, int]], budget: int
    ) -> int:
        bm = self.block_manager
        while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.swapped[0]
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not bm.can_swap_in(seq, num_new):
                break
            self.swapped.popleft()
            out.blocks_to_swap_in.extend(bm.swap_in(seq))
            out.blocks_to_copy.extend(bm.allocate_slots(seq, num_new))
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            steps.append((seq, num_new))
            budget -= num_new
        return budget

    def _schedule_waiting(
        self, out: SchedulerOutput, steps: list[tuple[Sequence, int]], budget: int
    ) -> int:
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if seq.request_id in out.preempted:
                break  # preempted this step for the ones ahead of it: it waits a step
            num_new = self._try_admit(seq, budget)
            if num_new is None:
                victim = self._outranked_by(seq)
                if victim is None:
                    break
                budget += self._preempt_for_waiting(victim, out, steps)
                continue
            self.waiting.popleft()
            out.blocks_to_copy.extend(self.block_manager.allocate_slots(seq, num_new))
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self.running.append(seq)
            steps.append((seq, num_new))
            budget -= num_new
        return budget

    def _schedule_drafts(
        self, out: SchedulerOutput, steps: list[tuple[Sequence, int]], budget: int
    ) -> dict[str, list[int]]:
        """Draft tokens for the step's decoding sequences, by request id, from the budget
        and free blocks left, cut to fit."""
        assert self.speculator is not None
        bm = self.block_manager
        drafts: dict[str, list[int]] = {}
        if not self.speculator.drafts_at(len(self.running)):
            return drafts
        for seq, num_new in steps:
            if budget <= 0:
                break
            found = self.speculator.draft(seq, budget, self.max_model_len)
            while found and not bm.can_allocate_slots(seq, num_new + len(found)):
                found.pop()
            if found:
                # Its own token's slot (and copy-on-write) is taken: this only grows it.
                out.blocks_to_copy.extend(bm.allocate_slots(seq, num_new + len(found)))
                drafts[seq.request_id] = found
                budget -= len(found)
        return drafts

    def _try_admit(self, seq: Sequence, budget: int) -> int | None:
        """The tokens a waiting sequence computes if it starts now (its cached prefix
        taken); None, with nothing taken, if there is no room for it."""
        if len(self.running) >= self.max_num_seqs:
            return None
        bm = self.block_manager
        num_hit = bm.allocate_cached_prefix(seq)
        num_new = min(seq.num_uncomputed_tokens, budget)
        if not self._can_admit(seq, num_new):
            bm.free(seq)
            seq.num_computed_tokens = 0
            return None
        bm.record_prefix_lookup(seq.num_tokens, num_hit)
        return num_new

    def _outranked_by(self, seq: Sequence) -> Sequence | None:
        """Under the priority policy, the running sequence to preempt so that ``seq``
        can start: the lowest-priority one, if its value is higher than ``seq``'s (equal
        priorities never preempt each other, which would only trade places)."""
        if self.policy != "priority" or not self.running:
            return None
        victim = max(self.running, key=priority_key)
        return victim if victim.priority > seq.priority else None

    def _preempt_for_waiting(
        self, victim: Sequence, out: SchedulerOutput, steps: list[tuple[Sequence, int]]
    ) -> int:
        """Preempt a running sequence for a waiting one of higher priority. If it was
        scheduled this step it leaves the step: returns the tokens it gives back."""
        given_back = 0
        for i, (seq, num_new) in enumerate(steps):
            if seq is victim:
                del steps[i]
                given_back = num_new
                # Its copy-on-write copy this step went to a block of its own, which is
                # freed now and may be handed out again in this step.
                own = set(victim.block_table)
                out.blocks_to_copy[:] = [c for c in out.blocks_to_copy if c[1] not in own]
                break
        self._preempt(victim, out)
        return given_back

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
        out.preempted.append(seq.request_id)
        if self.use_swap and self.block_manager.can_swap_out(seq):
            out.blocks_to_swap_out.extend(self.block_manager.swap_out(seq))
            seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(seq)
        else:
            self.block_manager.free(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self._to_waiting(seq, preempted=True)

    # ---- after the model step ----

    def update_from_output(
        self, out: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[SequenceUpdate]:
        """Apply a step's results: advance the scheduled sequences, append their sampled
        tokens, finish and free those that stop. Returns an update per sequence that
        made progress (sequences finished while the step ran are skipped)."""
        updates = []
        for item in out.scheduled:
            seq = self.sequences.get(item.request_id)
            if seq is None:  # finished (aborted) while the step ran
                continue
            seq.num_computed_tokens += item.num_new_tokens - item.num_draft_tokens
            draft_model = self.speculator is not None and self.speculator.uses_draft_model
            if draft_model:
                # Before any fork below: n > 1 choices share the prompt's draft KV too.
                self._advance_draft(seq, item)
            prompt_logprobs = runner_output.prompt_logprobs.get(seq.request_id, [])
            if prompt_logprobs:
                seq.num_prompt_logprobs += len(prompt_logprobs)
            sampled = runner_output.sampled.get(seq.request_id, [])
            embedding = runner_output.embeddings.get(seq.request_id)
            # An embedding request ends with its prefill: nothing is generated.
            status = SequenceStatus.FINISHED_STOPPED if embedding is not None else None
            new_tokens = []
            if sampled:
                if seq.fork_children:
                    self._fork_children(seq)
                new_tokens, status = _append_tokens(seq, sampled, self.max_model_len)
            if item.num_draft_tokens and sampled:
                # Each token kept before the last confirmed a draft, whose KV this step
                # computed; the slots of the rest go back.
                seq.num_computed_tokens += len(new_tokens) - 1
                self.block_manager.free_uncomputed_blocks(seq)
                if self.speculator is not None:
                    self.speculator.record(seq, item.num_draft_tokens, len(sampled) - 1)
            # Again, now that accepted drafts count as computed.
            registered = self._advance_draft(seq, item) if draft_model else None
            self.block_manager.register_full_blocks(seq, registered)
            if status is not None:
                self.finish(seq.request_id, status)
            updates.append(_update(seq, new_tokens, prompt_logprobs, embedding))
        return updates

    @staticmethod
    def _advance_draft(seq: Sequence, item: ScheduledSequence) -> int:
        """With a draft model: how far the draft model's KV reaches after this step (it
        ran on the step's own tokens and on every draft but the last, whose KV is never
        needed unless all are accepted); the tokens whose blocks may enter the prefix
        cache."""
        if item.draft_lag_token_ids is not None:
            reached = item.start + item.num_new_tokens - (1 if item.num_draft_tokens else 0)
            seq.num_draft_computed_tokens = min(reached, seq.num_computed_tokens)
        return seq.num_draft_computed_tokens

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
            child.num_prompt_logprobs = parent.num_prompt_logprobs  # complete now
            child.status = SequenceStatus.RUNNING
            child.first_scheduled_time = parent.first_scheduled_time
            self.running.append(child)
        parent.fork_children = []

    def time_out(self, request_id: str, now: float) -> SequenceUpdate | None:
        """End a sequence whose deadline has passed: "length" once it has output tokens
        (what it has is the answer, cut short as by max_tokens), "abort" before its
        first. Returns its update for the front end; None if the sequence is not
        unfinished or its deadline is still ahead."""
        seq = self.sequences.get(request_id)
        if seq is None or seq.deadline is None or seq.deadline > now:
            return None
        if seq.num_output_tokens:
            self.finish(request_id, SequenceStatus.FINISHED_LENGTH)
        else:
            self.finish(request_id, SequenceStatus.FINISHED_ABORTED)
        return _update(seq, [], [])

    def reject_unstarted(self, seq_ids: list[str]) -> list[SequenceUpdate]:
        """End a request's sequences (its choices) as rejected if none of them has been
        scheduled yet (max_queue_time). Returns their updates; none if the request has
        started or ended."""
        seqs = [self.sequences.get(seq_id) for seq_id in seq_ids]
        if not seqs or any(s is None or s.first_scheduled_time is not None for s in seqs):
            return []
        for seq in seqs:
            self.finish(seq.request_id, SequenceStatus.FINISHED_REJECTED)
        return [_update(seq, [], []) for seq in seqs]

    def finish(self, request_id: str, status: SequenceStatus) -> bool:
        """End a sequence wherever it is (a stop, an abort, a failure) and free its blocks.
        False if there is no such unfinished sequence."""
        assert status.is_finished
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return False
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
        return True


def schedule_entry(
    seq: Sequence,
    num_new: int,
    draft_token_ids: list[int] | None = None,
    draft_model: bool = False,
) -> ScheduledSequence:
    """The plain-data copy of what the runner needs of ``seq`` for this step: its next
    ``num_new`` tokens, then the draft tokens the step verifies. ``draft_model``: the
    runner has a draft model, which runs for this sequence where it drafts or computes
    more than its newest token (a prompt chunk), catching up on the tokens it lags by."""
    drafts = tuple(draft_token_ids or ())
    start = seq.num_computed_tokens
    params = seq.sampling_params
    reaches_end = start + num_new == seq.num_tokens
    samples = reaches_end and seq.pooling is None
    draft_lag = None
    if draft_model and seq.pooling is None:
        # A decode step without drafts leaves the draft model behind by a token: running
        # it in every step would cost a draft pass even where nothing is drafted.
        lone_decode = num_new == 1 and reaches_end and seq.num_output_tokens > 0
        if drafts or not lone_decode:
            draft_lag = tuple(seq.token_ids[seq.num_draft_computed_tokens : start])
    wants_history = params.has_penalties or seq.needs_prompt_logprobs
    return ScheduledSequence(
        request_id=seq.request_id,
        token_ids=seq.token_ids[start : start + num_new] + list(drafts),
        start=start,
        block_table=list(seq.block_table),
        samples=samples,
        sampling_params=params,
        draft_token_ids=drafts,
        draft_lag_token_ids=draft_lag,
        banned_token_ids=banned_token_ids(seq) if samples else frozenset(),
        prompt_token_ids=seq.prompt_token_ids if wants_history else None,
        output_token_ids=seq.output_token_ids if params.has_penalties else None,
        grammar_bitmask=(
            seq.grammar.compute_bitmask() if samples and seq.grammar is not None else None
        ),
        num_prompt_logprobs=seq.num_prompt_logprobs,
        pooling=seq.pooling,
        returns_embedding=reaches_end and seq.pooling is not None,
    )


def _append_tokens(
    seq: Sequence, sampled: list[SampledToken], max_model_len: int
) -> tuple[list[SampledToken], SequenceStatus | None]:
    """Append a step's tokens one by one, up to the first that ends the sequence (a stop
    token, eos, max_tokens...): the tokens kept, and the status that ends it, if any."""
    for i, token in enumerate(sampled):
        seq.token_ids.append(token.token_id)
        status = check_stop(seq, max_model_len)
        if status is not None:
            return sampled[: i + 1], status
    return sampled, None


def _update(
    seq: Sequence,
    new_tokens: list[SampledToken],
    prompt_logprobs: list,
    embedding: list[float] | None = None,
) -> SequenceUpdate:
    return SequenceUpdate(
        request_id=seq.request_id,
        new_tokens=new_tokens,
        new_prompt_logprobs=prompt_logprobs,
        finish_reason=seq.status.finish_reason,
        stop_reason=seq.stop_reason,
        num_output_tokens=seq.num_output_tokens,
        num_preemptions=seq.num_preemptions,
        first_scheduled_time=seq.first_scheduled_time,
        finished_time=seq.finished_time,
        embedding=embedding,
    )
