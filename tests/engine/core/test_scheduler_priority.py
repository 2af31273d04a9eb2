"""The priority scheduling policy and the time limit, in the scheduler alone: a factory
builds it, hand-made model outputs are fed to it (as in test_scheduler.py), and the
tests assert on what it scheduled, preempted and freed. Pure Python, no model.
"""

from __future__ import annotations

import itertools

from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.scheduler import Scheduler
from hetero_infer.engine.core.sequence import Sequence, SequenceStatus
from hetero_infer.engine.core.step_data import SchedulerOutput
from hetero_infer.engine.params.sampling_params import SamplingParams

from tests.engine.core.test_scheduler import EOS, feed, run_step, scheduled, used_blocks

# Arrival times set by hand: ties in priority are broken by them, and two sequences
# made in a row could read the same clock.
_arrivals = itertools.count(1)


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 64,
    policy: str = "priority",
) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, block_size),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=256,
        policy=policy,
    )


def make_seq(
    request_id: str,
    prompt_len: int,
    priority: int = 0,
    max_tokens: int = 100,
    deadline: float | None = None,
) -> Sequence:
    base = 1000 * (1 + sum(map(ord, request_id)))  # no prefix shared between requests
    seq = Sequence(
        request_id,
        [base + i for i in range(prompt_len)],
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        eos_token_ids=frozenset({EOS}),
        priority=priority,
        deadline=deadline,
    )
    seq.arrival_time = float(next(_arrivals))
    return seq


def ids(seqs) -> list[str]:
    return [s.request_id for s in seqs]


def run_to_end(sched: Scheduler, max_steps: int = 1000) -> None:
    for _ in range(max_steps):
        if not sched.queues.has_unfinished():
            return
        run_step(sched)
    raise AssertionError("the scheduler did not drain")


# ---- order ----


def test_waiting_requests_start_by_priority_then_arrival() -> None:
    sched = make_scheduler(max_num_seqs=2)
    for rid, priority in [("a", 2), ("b", 0), ("c", 1), ("d", 0)]:
        sched.queues.add(make_seq(rid, 4, priority))
    out = run_step(sched)
    assert scheduled(out) == [("b", 4), ("d", 4)]
    assert ids(sched.queues.waiting) == ["c", "a"]


def test_fcfs_ignores_priority() -> None:
    sched = make_scheduler(max_num_seqs=2, policy="fcfs")
    for rid, priority in [("a", 2), ("b", 0), ("c", 1)]:
        sched.queues.add(make_seq(rid, 4, priority))
    out = run_step(sched)
    assert scheduled(out) == [("a", 4), ("b", 4)]


def test_the_budget_goes_to_the_higher_priority_running_sequence_first() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    sched.queues.add(make_seq("lo", 6, priority=2))
    run_step(sched)
    sched.queues.add(make_seq("hi", 20, priority=0))
    out = run_step(sched)
    assert scheduled(out) == [("lo", 1), ("hi", 7)]  # running first, as always
    # Both run now: hi's prefill takes the whole budget before lo's decode (FCFS
    # would schedule lo, the older, first).
    out = run_step(sched)
    assert scheduled(out) == [("hi", 8)]


# ---- preemption ----


def step_after_hi_arrives(sched: Scheduler, lo_len: int, hi_len: int) -> SchedulerOutput:
    """lo1 (priority 2) and lo2 (priority 1) run a step, then hi (priority 0) arrives:
    the step after."""
    sched.queues.add(make_seq("lo1", lo_len, priority=2))
    sched.queues.add(make_seq("lo2", lo_len, priority=1))
    run_step(sched)
    sched.queues.add(make_seq("hi", hi_len, priority=0))
    return run_step(sched)


def test_a_higher_priority_request_preempts_the_lowest_running_one_for_a_slot() -> None:
    sched = make_scheduler(max_num_seqs=2)
    out = step_after_hi_arrives(sched, lo_len=4, hi_len=4)
    assert out.preempted == ["lo1"]
    assert scheduled(out) == [("lo2", 1), ("hi", 4)]
    lo1 = sched.queues.sequences["lo1"]
    assert lo1.status == SequenceStatus.WAITING and lo1.block_table == []
    assert ids(sched.queues.waiting) == ["lo1"] and ids(sched.queues.running) == ["lo2", "hi"]
    assert used_blocks(sched) == 2 + 1  # lo2: 5 tokens; hi: its 4-token prompt


def test_a_higher_priority_request_preempts_for_blocks() -> None:
    sched = make_scheduler(num_blocks=6, block_size=4)
    lo = make_seq("lo", 16, priority=1, max_tokens=3)
    sched.queues.add(lo)
    run_step(sched)  # lo holds 4 of the 6 blocks, and needs a fifth next step
    hi = make_seq("hi", 12, priority=0, max_tokens=3)
    sched.queues.add(hi)
    out = run_step(sched)
    assert out.preempted == ["lo"] and scheduled(out) == [("hi", 12)]
    run_to_end(sched)
    # lo came back, recomputed, and ended as if it had never left.
    assert lo.status == hi.status == SequenceStatus.FINISHED_LENGTH
    assert lo.num_output_tokens == hi.num_output_tokens == 3
    assert lo.num_preemptions == 1 and hi.num_preemptions == 0
    assert used_blocks(sched) == 0


def test_a_victim_scheduled_in_the_step_gives_its_tokens_back() -> None:
    # lo1 and lo2 decode (1 token each) before hi is looked at; hi's 7-token prompt
    # gets the whole rest of the budget only if lo1's token comes back with lo1.
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=8)
    out = step_after_hi_arrives(sched, lo_len=3, hi_len=7)
    assert out.preempted == ["lo1"]
    assert scheduled(out) == [("lo2", 1), ("hi", 7)]


def test_a_higher_priority_request_never_preempts_for_the_budget() -> None:
    # The running decodes take the whole budget, as running sequences go first: hi
    # waits, since a waiting request preempts only for blocks or a slot.
    sched = make_scheduler(max_num_batched_tokens=2)
    out = step_after_hi_arrives(sched, lo_len=1, hi_len=4)
    assert out.preempted == [] and scheduled(out) == [("lo2", 1), ("lo1", 1)]


def test_equal_priorities_never_preempt_each_other() -> None:
    sched = make_scheduler(max_num_seqs=1)
    sched.queues.add(make_seq("a", 4, priority=1))
    run_step(sched)
    sched.queues.add(make_seq("b", 4, priority=1))
    out = run_step(sched)
    assert out.preempted == [] and scheduled(out) == [("a", 1)]


def test_a_lower_priority_request_waits() -> None:
    sched = make_scheduler(max_num_seqs=1)
    sched.queues.add(make_seq("a", 4, priority=0))
    run_step(sched)
    sched.queues.add(make_seq("b", 4, priority=3))
    out = run_step(sched)
    assert out.preempted == [] and scheduled(out) == [("a", 1)]


def test_short_blocks_preempt_the_lowest_priority_running_sequence_not_the_newest() -> None:
    # lo came first, hi second; both fill their second block. When lo needs a third
    # block there is none: FCFS would preempt hi (the newest), priority takes lo.
    sched = make_scheduler(num_blocks=4, block_size=4)
    lo = make_seq("lo", 7, priority=2)
    sched.queues.add(lo)
    run_step(sched)
    sched.queues.add(make_seq("hi", 7, priority=0))
    run_step(sched)
    assert used_blocks(sched) == 4
    out = run_step(sched)
    assert out.preempted == ["lo"] and scheduled(out) == [("hi", 1)]
    assert lo.status == SequenceStatus.WAITING


def test_a_preempted_sequence_waits_ahead_of_later_ones_of_its_priority() -> None:
    sched = make_scheduler(max_num_seqs=1)
    sched.queues.add(make_seq("lo", 4, priority=1))
    run_step(sched)
    sched.queues.add(make_seq("later", 4, priority=1))
    sched.queues.add(make_seq("hi", 4, priority=0))
    run_step(sched)  # hi preempts lo
    assert ids(sched.queues.running) == ["hi"]
    assert ids(sched.queues.waiting) == ["lo", "later"]


def test_a_victim_waits_a_step_before_it_is_admitted_again() -> None:
    # hi takes lo's blocks; there would be room for lo's prompt again at once, but a
    # sequence preempted in this step is not re-admitted in it.
    sched = make_scheduler(num_blocks=8, block_size=4)
    sched.queues.add(make_seq("lo", 16, priority=1))
    run_step(sched)
    sched.queues.add(make_seq("hi", 16, priority=0))
    out = run_step(sched)
    # lo's four full blocks are still cached and free, and one more block would do.
    assert out.preempted == ["lo"] and scheduled(out) == [("hi", 16)]
    assert ids(sched.queues.waiting) == ["lo"]


# ---- time limit ----


def test_time_out_before_the_first_token_is_an_abort() -> None:
    sched = make_scheduler(max_num_seqs=1)
    sched.queues.add(make_seq("a", 4))
    sched.queues.add(make_seq("b", 4, deadline=10.0))
    run_step(sched)
    assert sched.queues.time_out("b", now=9.0) is None  # not yet
    update = sched.queues.time_out("b", now=10.0)
    assert update is not None and update.finish_reason == "abort"
    assert update.num_output_tokens == 0 and update.new_tokens == []
    assert ids(sched.queues.waiting) == [] and "b" not in sched.queues.sequences


def test_time_out_after_tokens_is_a_length_finish_and_frees_the_blocks() -> None:
    sched = make_scheduler()
    seq = make_seq("a", 6, deadline=10.0)
    sched.queues.add(seq)
    run_step(sched)
    run_step(sched)
    assert used_blocks(sched) == 2
    update = sched.queues.time_out("a", now=11.0)
    assert update is not None and update.finish_reason == "length"
    assert update.num_output_tokens == 2
    assert seq.status == SequenceStatus.FINISHED_LENGTH and seq.block_table == []
    assert used_blocks(sched) == 0 and not sched.queues.has_unfinished()
    # The step that ran while it timed out is dropped, and it is reported finished.
    assert sched.schedule().finished == ["a"]


def test_time_out_ignores_sequences_without_a_deadline_and_finished_ones() -> None:
    sched = make_scheduler()
    sched.queues.add(make_seq("a", 4))
    assert sched.queues.time_out("a", now=1e12) is None
    assert sched.queues.time_out("nobody", now=1e12) is None
    out = sched.schedule()
    sched.queues.finish("a", SequenceStatus.FINISHED_ABORTED)
    assert feed(sched, out) == []  # the step's result for a finished sequence is dropped
