"""EngineCore on its own: a scheduler, a fake runner that "samples" without weights, and
the core's add / finish / step, time limits and counters included."""

from __future__ import annotations

import time

from hetero_infer.engine.core.engine_core import CoreCounters, EngineCore
from hetero_infer.engine.core.sequence import Sequence, SequenceStatus
from hetero_infer.engine.core.step_data import ModelRunnerOutput, SampledToken, SchedulerOutput
from hetero_infer.engine.params.sampling_params import SamplingParams

from tests.engine.core.test_scheduler import EOS, make_scheduler


class FakeRunner:
    """Samples token 10 + position for every sequence that samples: no model."""

    def __init__(self) -> None:
        self.steps: list[SchedulerOutput] = []

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.steps.append(out)
        sampled = {
            s.request_id: [SampledToken(10 + s.sample_position, 0.0)]
            for s in out.scheduled
            if s.samples
        }
        return ModelRunnerOutput(sampled)


def choices(
    request_id: str, n: int, max_tokens: int, deadline: float | None = None
) -> list[Sequence]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    ids = [request_id] + [f"{request_id}#{i}" for i in range(1, n)]
    return [Sequence(i, [1, 2, 3, 4, 5], params, frozenset({EOS}), deadline=deadline) for i in ids]


def run(core: EngineCore) -> dict[str, list]:
    updates: dict[str, list] = {}
    while core.has_unfinished():
        for update in core.step():
            updates.setdefault(update.request_id, []).append(update)
    return updates


def test_a_request_runs_to_its_length_and_its_choices_fork():
    counters = CoreCounters()
    runner = FakeRunner()
    core = EngineCore(make_scheduler(), runner, counters)
    core.add(choices("a", n=3, max_tokens=4), deadline=None)
    updates = run(core)
    assert set(updates) == {"a", "a#1", "a#2"}
    for seq_updates in updates.values():
        tokens = [t.token_id for u in seq_updates for t in u.new_tokens]
        assert tokens == [15, 16, 17, 18]  # 10 + position, from the prompt's end on
        assert seq_updates[-1].finish_reason == "length"
    # The prompt was computed once: the first step schedules only choice 0.
    assert [s.request_id for s in runner.steps[0].scheduled] == ["a"]
    # Choice 0's 4 steps, and one more for the forked choices, which pick their first
    # token a step later. (A last, empty step tells the runner which sequences ended.)
    assert counters.num_steps == len([s for s in runner.steps if not s.is_empty]) == 5
    assert counters.tokens_generated == 3 * 4 and counters.max_batch_size == 3
    assert core.scheduler.block_manager.num_used_blocks == 0


def test_finish_ends_a_request_wherever_it_is():
    core = EngineCore(make_scheduler(), FakeRunner(), CoreCounters())
    core.add(choices("a", n=1, max_tokens=50), deadline=None)
    core.step()
    core.finish(["a"], SequenceStatus.FINISHED_ABORTED)
    assert not core.has_unfinished()
    assert core.scheduler.block_manager.num_used_blocks == 0


def test_time_limits_end_requests_between_steps():
    counters = CoreCounters()
    core = EngineCore(make_scheduler(), FakeRunner(), counters, max_queue_time=60.0)
    past = time.monotonic() - 1
    core.add(choices("late", n=2, max_tokens=50, deadline=past), deadline=past)
    core.add(choices("ok", n=1, max_tokens=2), deadline=None)
    updates = run(core)
    # Ended before its first token: an abort, each choice (the second never forked).
    assert [u.finish_reason for u in updates["late"]] == ["abort"]
    assert updates["ok"][-1].finish_reason == "length"
    assert counters.num_timeouts == 1 and counters.num_rejected == 0


def test_a_request_that_waits_past_max_queue_time_is_rejected():
    counters = CoreCounters()
    scheduler = make_scheduler(max_num_seqs=1)
    core = EngineCore(scheduler, FakeRunner(), counters, max_queue_time=1e-6)
    core.add(choices("first", n=1, max_tokens=3), deadline=None)
    time.sleep(0.01)  # both are due before the first step: neither has started
    core.add(choices("second", n=1, max_tokens=3), deadline=None)
    time.sleep(0.01)
    updates = run(core)
    assert updates["first"][-1].finish_reason == "rejected"
    assert updates["second"][-1].finish_reason == "rejected"
    assert counters.num_rejected == 2 and counters.num_steps == 0


def test_a_request_started_before_max_queue_time_runs_to_its_end():
    """The limit is on the wait for a first step: one of n choices started is enough
    (the others fork later), and a request that has started is never rejected."""
    counters = CoreCounters()
    scheduler = make_scheduler(max_num_seqs=2)
    core = EngineCore(scheduler, FakeRunner(), counters, max_queue_time=0.05)
    core.add(choices("started", n=2, max_tokens=4), deadline=None)
    core.step()  # its first choice's prompt: started
    time.sleep(0.06)  # past its deadline, which the next step checks
    updates = run(core)
    assert [u.finish_reason for u in updates["started"]][-1] == "length"
    assert updates["started#1"][-1].finish_reason == "length"
    assert counters.num_rejected == 0
