"""EngineCore: the engine reduced to add, abort and step.

A step first ends the requests past their time limits, then schedules, runs the model
and applies its output (schedule -> execute -> update), and returns a SequenceUpdate
per sequence it touched. The front ends around it (LLMEngine, and through it
AsyncEngine and InferenceEngine) check and fan out requests before, and turn updates
into outputs after. The core knows no tokenizer, text or output kind, and its runner
is any object with ``execute``: a test drives it with a fake one and no weights.

With async scheduling (vLLM's ``--async-scheduling``) the runner executes steps on a
thread of its own, in order, and a step schedules the next one before it waits for the
one in flight: the host's work for step N+1 (schedule, hand over) and for step N
(update, then the front end's outputs) happens while the device computes. The step
handed over advances its sequences as if it had run, its sampled tokens pending
(core/pending_tokens.py); tokens a sequence samples after it stopped are dropped.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from hetero_infer.engine.core.pending_tokens import hand_over, needs_known_tokens
from hetero_infer.engine.core.scheduler import Scheduler
from hetero_infer.engine.core.sequence import Sequence, SequenceStatus
from hetero_infer.engine.core.step_data import ModelRunnerOutput, SchedulerOutput, SequenceUpdate


class StepRunner(Protocol):
    """What the core needs of the model runner (worker/model_runner.py)."""

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput: ...


@dataclass
class CoreCounters:
    """What the core counts (the engine's metrics extend these)."""

    tokens_generated: int = 0
    num_steps: int = 0
    num_preemptions: int = 0
    num_timeouts: int = 0  # requests ended by their time limit
    num_rejected: int = 0  # requests refused after max_queue_time in the queue
    busy_time: float = 0.0  # seconds spent in steps that ran the model
    max_batch_size: int = 0  # most sequences in one forward pass
    # How many steps ran each number of tokens (prompt chunks, decodes and drafts): the
    # distinct sizes are at most max_num_batched_tokens.
    step_tokens: Counter[int] = field(default_factory=Counter)


class EngineCore:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: StepRunner,
        counters: CoreCounters,
        max_queue_time: float | None = None,
        async_scheduling: bool = False,
    ) -> None:
        """``max_queue_time``: seconds a request may wait before it is first scheduled."""
        self.scheduler = scheduler
        self.runner = runner
        self.counters = counters
        self.max_queue_time = max_queue_time
        # Async scheduling: the runner's thread, and the step it runs (its schedule, its
        # output to come, when it was handed over).
        self._runner_thread = (
            ThreadPoolExecutor(1, thread_name_prefix="model-step") if async_scheduling else None
        )
        self._in_flight: tuple[SchedulerOutput, Future[ModelRunnerOutput], float] | None = None
        self._busy_until = 0.0  # when the last step applied ended (steps overlap)
        # (when, a request's choices' sequence ids), soonest first: the requests with a
        # time limit, and (max_queue_time) the time each must have started by. An entry
        # stays until its time even if its request ends earlier: a check between steps
        # costs a heap peek when none is due.
        self._deadlines: list[tuple[float, tuple[str, ...]]] = []
        self._start_deadlines: list[tuple[float, tuple[str, ...]]] = []

    def add(self, choices: list[Sequence], deadline: float | None) -> None:
        """Queue a request's choices: the first computes the prompt, the others fork from
        its KV blocks then."""
        first = choices[0]
        first.fork_children = choices[1:]
        self.scheduler.queues.add(first)
        seq_ids = tuple(seq.request_id for seq in choices)
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, seq_ids))
        if self.max_queue_time is not None:
            start_by = first.arrival_time + self.max_queue_time
            heapq.heappush(self._start_deadlines, (start_by, seq_ids))

    def finish(self, seq_ids: list[str], status: SequenceStatus) -> None:
        """End sequences wherever they are (an abort; a stop string the front end found)
        and free their blocks."""
        for seq_id in seq_ids:
            self.scheduler.queues.finish(seq_id, status)

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache (BlockManager.reset_prefix_cache); its KV event,
        AllBlocksCleared, goes out now rather than with the next step's."""
        block_manager = self.scheduler.block_manager
        reset = block_manager.reset_prefix_cache()
        if reset and block_manager.events is not None:
            block_manager.events.end_step()
        return reset

    def has_unfinished(self) -> bool:
        return self.scheduler.queues.has_unfinished() or self._in_flight is not None

    def step(self) -> list[SequenceUpdate]:
        """One step: the due time limits, then schedule -> execute -> update; with async
        scheduling, schedule and hand over the next step before the update of the one
        in flight (which waits for it first where a sequence's schedule needs its
        tokens)."""
        started = time.perf_counter()
        updates = self._time_out() + self._reject_unstarted()
        if self._runner_thread is None:
            scheduled = self._schedule()
            return updates + self._apply(scheduled, self.runner.execute(scheduled), started)
        if self._in_flight is not None and any(
            needs_known_tokens(seq) for seq in self._in_flight_sequences()
        ):
            previous, self._in_flight = self._in_flight, None
            updates += self._settle(previous)
        scheduled = self._schedule()
        previous, self._in_flight = self._in_flight, None
        if scheduled.is_empty:  # nothing to overlap: the runner's bookkeeping, here
            updates += self._settle(previous)
            return updates + self._apply(scheduled, self.runner.execute(scheduled), started)
        sequences = self.scheduler.queues.sequences
        for item in scheduled.scheduled:
            seq = sequences[item.request_id]
            hand_over(seq, item)
            # Its full blocks are findable at once, as a later step reads them after
            # this one wrote them (the runner runs steps in order).
            self.scheduler.block_manager.register_full_blocks(seq)
        future = self._runner_thread.submit(self.runner.execute, scheduled)
        self._in_flight = (scheduled, future, started)
        return updates + self._settle(previous)

    def wait_for_runner(self) -> None:
        """Async scheduling: wait until the runner has computed the step in flight (its
        update stays for the next step), so that the caller may use the runner."""
        if self._in_flight is not None:
            self._in_flight[1].result()

    def _schedule(self) -> SchedulerOutput:
        scheduled = self.scheduler.schedule()
        # The prefix cache's tier moves (engine/kv/), planned while scheduling.
        scheduled.tier_moves.extend(self.scheduler.block_manager.take_tier_moves())
        return scheduled

    def _in_flight_sequences(self) -> list[Sequence]:
        assert self._in_flight is not None
        sequences = self.scheduler.queues.sequences
        scheduled = self._in_flight[0].scheduled
        return [seq for item in scheduled if (seq := sequences.get(item.request_id)) is not None]

    def _settle(
        self, step: tuple[SchedulerOutput, Future[ModelRunnerOutput], float] | None
    ) -> list[SequenceUpdate]:
        """Async scheduling: wait for a step handed over (if any), and apply it."""
        if step is None:
            return []
        scheduled, output, started = step
        return self._apply(scheduled, output.result(), started, handed_over=True)

    def _apply(
        self,
        scheduled: SchedulerOutput,
        output: ModelRunnerOutput,
        started: float,
        handed_over: bool = False,
    ) -> list[SequenceUpdate]:
        """A step's output into its sequences (Scheduler.update_from_output), what the
        disk reads found, the KV events and the counters."""
        block_manager = self.scheduler.block_manager
        block_manager.tier_reads_done(output.tier_reads)
        updates = self.scheduler.update_from_output(scheduled, output, handed_over)
        if block_manager.events is not None:
            block_manager.events.end_step()
        if not self.has_unfinished():
            # No step may come for a while: the blocks this one computed go to the
            # disk tier now.
            self.apply_tier_moves()
        counters = self.counters
        counters.num_preemptions += len(scheduled.preempted)
        if not scheduled.is_empty:
            counters.num_steps += 1
            # The tokens kept: not those past a stop, nor a stopped sequence's in a step
            # handed over before its stop was known.
            counters.tokens_generated += sum(len(update.new_tokens) for update in updates)
            counters.max_batch_size = max(counters.max_batch_size, len(scheduled.scheduled))
            counters.step_tokens[scheduled.num_batched_tokens] += 1
            now = time.perf_counter()
            counters.busy_time += now - max(started, self._busy_until)
            self._busy_until = now
        return updates

    def apply_tier_moves(self, unsaved: bool = False) -> None:
        """The tier moves planned since the last step, without a step; ``unsaved``: and
        those that write every block the pools and host RAM hold that disk does not
        (a stop's, so that a restart finds them)."""
        self.wait_for_runner()  # (only between steps: its update is the next step's)
        block_manager = self.scheduler.block_manager
        moves = block_manager.take_tier_moves()
        if unsaved and block_manager.tiers is not None:
            pools = [group.pool for group in block_manager.groups]
            moves += block_manager.tiers.unsaved_moves(pools)
        if moves:
            output = self.runner.execute(SchedulerOutput(tier_moves=moves))
            block_manager.tier_reads_done(output.tier_reads)

    def _time_out(self) -> list[SequenceUpdate]:
        """End the requests whose deadline has passed, every choice (Scheduler.time_out).
        Checked between steps, so a request ends at most a step late."""
        now = time.monotonic()
        updates: list[SequenceUpdate] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, seq_ids = heapq.heappop(self._deadlines)
            ended = [
                update
                for seq_id in seq_ids
                if (update := self.scheduler.queues.time_out(seq_id, now)) is not None
            ]
            if ended:
                self.counters.num_timeouts += 1
                updates += ended
        return updates

    def _reject_unstarted(self) -> list[SequenceUpdate]:
        """max_queue_time: refuse the requests that have waited that long without being
        scheduled once; served that late, their answer would come too late to be of use,
        and refused (a 503) they can be retried on a less busy replica."""
        now = time.monotonic()
        updates: list[SequenceUpdate] = []
        while self._start_deadlines and self._start_deadlines[0][0] <= now:
            _, seq_ids = heapq.heappop(self._start_deadlines)
            rejected = self.scheduler.queues.reject_unstarted(list(seq_ids))
            if rejected:
                self.counters.num_rejected += 1
                updates += rejected
        return updates
