"""Token-budget continuous batching with chunked prefill and preemption.

Each step gets at most ``max_num_batched_tokens`` tokens. Running sequences go first (a
decode costs one token, an unfinished prefill the rest of its prompt, cut to the
budget, though never inside an image whose tokens see each other both ways), then
swapped-out sequences come back, then waiting ones are admitted while blocks, the
budget, ``max_num_seqs`` and the ``memory_threshold`` watermark allow. When a running
sequence cannot get a block, the newest running sequence is preempted: its
KV is dropped and recomputed later, or swapped to CPU blocks when there is swap space.
No torch here.

Two policies order the work, as vLLM's ``--scheduling-policy``: "fcfs" (arrival order)
and "priority" (lower ``priority`` values first, ties by arrival). Under "priority" the
running sequences are kept best first, so the one preempted when blocks run out is the
lowest-priority one, and a waiting sequence that cannot start for want of blocks or of
a ``max_num_seqs`` slot preempts running ones of a lower priority (a higher value).

With a speculator, decoding sequences get draft tokens from what the step has left
(core/speculator.py); after the step, rejected drafts' slots go back.

LongRoPE (Phi-3's long-context models): a sequence past the original context when it
starts takes the long factors from the start (as one transformers pass would); one that
crosses it while generating starts again (preempted by recompute), as transformers does.
"""

from __future__ import annotations

from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.pending_tokens import put_back, take_pending
from hetero_infer.engine.core.sequence import Sequence, SequenceStatus
from hetero_infer.engine.core.sequence_queues import SequenceQueues, priority_key
from hetero_infer.engine.core.speculator import Speculator, advance_draft_kv
from hetero_infer.engine.core.step_data import ModelRunnerOutput, SchedulerOutput, SequenceUpdate
from hetero_infer.engine.core.step_records import schedule_entry, sequence_update
from hetero_infer.engine.core.stop import append_until_stop


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
        long_rope_after: int | None = None,
    ) -> None:
        # A sequence preempted for a higher-priority one may have been scheduled in the
        # same step, after swap-ins: swapping it out then would overwrite their CPU
        # blocks before they are read, so the priority policy preempts by recompute.
        assert not (policy == "priority" and use_swap), "the priority policy recomputes"
        # The unfinished sequences, in the policy's order; each step moves some of them.
        self.queues = SequenceQueues(block_manager, policy)
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.memory_threshold = memory_threshold
        self.use_swap = use_swap
        self.speculator = speculator
        self.long_rope_after = long_rope_after
        self.num_preemptions = 0

    # ---- scheduling ----

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished=self.queues.take_finished_ids())
        steps: list[tuple[Sequence, int]] = []  # (sequence, tokens it computes)
        budget = self.max_num_batched_tokens
        if self.queues.policy == "priority":
            # Best first: they get the budget first, and running[-1] is the lowest.
            self.queues.running.sort(key=priority_key)
        budget = self._schedule_running(out, steps, budget)
        drafts: dict[str, list[int]] = {}
        if not out.preempted:  # memory is short: admit nothing new this step
            budget = self._schedule_swapped(out, steps, budget)
            if not self.queues.swapped:
                budget = self._schedule_waiting(out, steps, budget)
            if self.speculator is not None:
                running = len(self.queues.running)
                drafts = self.speculator.schedule_drafts(
                    steps, budget, running, self.block_manager, out, self.max_model_len
                )
        out.later_group_moves.extend(self.block_manager.take_later_group_moves())
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
        long_rope = self.long_rope_after is not None  # (asked once: most models have none)
        i = 0
        while i < len(self.queues.running) and budget > 0:
            seq = self.queues.running[i]
            if long_rope and self._crossed_long_rope(seq):
                self._preempt(seq, out)  # by recompute: it starts again, long
                continue
            num_new = seq.chunk_tokens(budget)
            if num_new == 0:  # the rest of an image, for a step with room for it
                i += 1
                continue
            if not bm.has_room(seq, num_new):  # else its blocks hold the new tokens already
                while not bm.can_allocate_slots(seq, num_new):
                    victim = self.queues.running[-1]
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
        while self.queues.swapped and budget > 0:
            seq = self.queues.swapped[0]
            num_new = seq.chunk_tokens(budget)
            if (
                num_new == 0
                or not self.queues.has_slots(seq, self.max_num_seqs)
                or not bm.can_swap_in(seq, num_new)
            ):
                break
            self.queues.swapped.popleft()
            out.blocks_to_swap_in.extend(bm.swap_in(seq))
            out.blocks_to_copy.extend(bm.allocate_slots(seq, num_new))
            seq.status = SequenceStatus.RUNNING
            self.queues.running.append(seq)
            steps.append((seq, num_new))
            budget -= num_new
        return budget

    def _schedule_waiting(
        self, out: SchedulerOutput, steps: list[tuple[Sequence, int]], budget: int
    ) -> int:
        while self.queues.waiting and budget > 0:
            seq = self.queues.waiting[0]
            if seq.request_id in out.preempted:
                break  # preempted this step for the ones ahead of it: it waits a step
            num_new = self._try_admit(seq, budget)
            if num_new is None:
                victim = self.queues.outranking(seq)
                if victim is None:
                    break
                budget += self._preempt_for_waiting(victim, out, steps)
                continue
            self.queues.waiting.popleft()
            out.blocks_to_copy.extend(self.block_manager.allocate_slots(seq, num_new))
            seq.status = SequenceStatus.RUNNING
            seq.start()
            self.queues.running.append(seq)
            steps.append((seq, num_new))
            budget -= num_new
        return budget

    def _try_admit(self, seq: Sequence, budget: int) -> int | None:
        """The tokens a waiting sequence computes if it starts now (its cached prefix
        taken); None, with nothing taken, if there is no room for it."""
        if not self.queues.has_slots(seq, self.max_num_seqs):
            return None
        bm = self.block_manager
        long_rope = self.long_rope_after is not None and seq.num_tokens > self.long_rope_after
        if long_rope != seq.long_rope:
            seq.long_rope = long_rope
            seq.block_hashes = []  # salted the other way
        if bm.waits_for_tier_reads(seq):  # a step, for its prefix's files to be read
            return None
        num_hit = bm.allocate_cached_prefix(seq)
        num_new = seq.chunk_tokens(budget)
        if num_new == 0 or not self._can_admit(seq, num_new):
            bm.free(seq)
            seq.num_computed_tokens = 0
            return None
        bm.record_prefix_lookup(seq.num_tokens, num_hit)
        return num_new

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
                self.block_manager.forget_copies_into(victim, out.blocks_to_copy)
                break
        self._preempt(victim, out)
        return given_back

    def _can_admit(self, seq: Sequence, num_new_tokens: int) -> bool:
        bm = self.block_manager
        if not bm.can_allocate_slots(seq, num_new_tokens):
            return False
        needed = bm.num_blocks_needed(seq, num_new_tokens)
        if not self.queues.running:
            return True  # the watermark must never starve a lone request
        return bm.num_used_blocks + needed <= self.memory_threshold * bm.num_blocks

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.queues.running.remove(seq)
        self.num_preemptions += 1
        seq.num_preemptions += 1
        out.preempted.append(seq.request_id)
        restart = self._crossed_long_rope(seq)
        if self.use_swap and not restart and self.block_manager.can_swap_out(seq):
            out.blocks_to_swap_out.extend(self.block_manager.swap_out(seq))
            seq.status = SequenceStatus.SWAPPED
            self.queues.swapped.appendleft(seq)
        else:
            self.block_manager.free(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self.queues.enqueue(seq, preempted=True)

    def _crossed_long_rope(self, seq: Sequence) -> bool:
        """Whether the sequence's tokens passed LongRoPE's original context since it
        started computing them with the short factors."""
        limit = self.long_rope_after
        return limit is not None and not seq.long_rope and seq.num_tokens > limit

    # ---- after the model step ----

    def update_from_output(
        self, out: SchedulerOutput, runner_output: ModelRunnerOutput, handed_over: bool = False
    ) -> list[SequenceUpdate]:
        """Apply a step's results: advance the scheduled sequences, append their sampled
        tokens, finish and free those that stop. Returns an update per sequence that
        made progress (sequences finished while the step ran are skipped).
        ``handed_over``: the sequences were advanced when the step was handed to the
        runner, their tokens pending (async scheduling, core/pending_tokens.py)."""
        updates = []
        draft_model = self.speculator is not None and self.speculator.uses_draft_model
        sequences, block_size = self.queues.sequences, self.block_manager.block_size
        sampled_of, embeddings_of = runner_output.sampled, runner_output.embeddings
        prompt_logprobs_of = runner_output.prompt_logprobs
        for item in out.scheduled:
            seq = sequences.get(item.request_id)
            if seq is None:  # finished (aborted) while the step ran
                continue
            num_drafts = len(item.draft_token_ids)
            if not handed_over:
                seq.num_computed_tokens += len(item.token_ids) - num_drafts
            if draft_model:
                # Before any fork below: n > 1 choices share the prompt's draft KV too.
                advance_draft_kv(seq, item)
            prompt_logprobs = prompt_logprobs_of.get(seq.request_id, [])
            if prompt_logprobs:
                seq.num_prompt_logprobs += len(prompt_logprobs)
            sampled = sampled_of.get(seq.request_id)
            embedding = embeddings_of.get(seq.request_id)
            # An embedding request ends with its prefill: nothing is generated.
            status = SequenceStatus.FINISHED_STOPPED if embedding is not None else None
            new_tokens = []
            if sampled:
                later = take_pending(seq) if handed_over else 0  # the next step's
                if seq.fork_children:
                    self.queues.start_forks(seq)
                new_tokens, status = append_until_stop(seq, sampled, self.max_model_len)
                if status is None and later:  # async: the step after's tokens, pending
                    put_back(seq, later)
            if num_drafts and sampled:
                # Each token kept before the last confirmed a draft, whose KV this step
                # computed; the slots of the rest go back.
                seq.num_computed_tokens += len(new_tokens) - 1
                self.block_manager.free_uncomputed_blocks(seq)
                if self.speculator is not None:
                    self.speculator.record(seq, num_drafts, len(sampled) - 1)
            # Again, now that accepted drafts count as computed.
            registered = advance_draft_kv(seq, item) if draft_model else None
            # Not preempted since it was handed over, and (register_full_blocks' own
            # first test, without the call) a block newly full: most decode steps fill none.
            if seq.status is SequenceStatus.RUNNING and (
                registered is not None
                or seq.num_computed_tokens >= (seq.num_registered_blocks + 1) * block_size
            ):
                self.block_manager.register_full_blocks(seq, registered)
            if status is not None:
                self.queues.finish(seq.request_id, status)
            updates.append(sequence_update(seq, new_tokens, prompt_logprobs, embedding))
        return updates
