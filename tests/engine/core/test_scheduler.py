"""Scheduler unit tests in the style of vLLM v1's: a factory builds a scheduler,
hand-made model outputs are fed to it, and the tests assert on what it scheduled.
Pure Python, no model.
"""

from __future__ import annotations

from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.scheduler import Scheduler
from hetero_infer.engine.core.sequence import Sequence, SequenceStatus
from hetero_infer.engine.core.step_data import (
    ModelRunnerOutput,
    SampledToken,
    SchedulerOutput,
    SequenceUpdate,
)
from hetero_infer.engine.params.image_input import ImageInput
from hetero_infer.engine.params.sampling_params import SamplingParams

EOS = 0
TOKEN = 7  # what the "model" samples unless a test says otherwise


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    num_cpu_blocks: int = 0,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 256,
    memory_threshold: float = 1.0,
    use_swap: bool = False,
    enable_prefix_caching: bool = True,
    long_rope_after: int | None = None,
) -> Scheduler:
    bm = BlockManager(num_blocks, block_size, num_cpu_blocks, enable_prefix_caching)
    return Scheduler(
        bm,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        memory_threshold=memory_threshold,
        use_swap=use_swap,
        long_rope_after=long_rope_after,
    )


def make_seq(
    request_id: str,
    prompt_len: int | None = None,
    token_ids: list[int] | None = None,
    max_tokens: int = 100,
    ignore_eos: bool = False,
) -> Sequence:
    if token_ids is None:
        assert prompt_len is not None
        # Distinct per request, so prefixes are shared only where a test means it.
        base = 1000 * (1 + sum(map(ord, request_id)))
        token_ids = [base + i for i in range(prompt_len)]
    return Sequence(
        request_id,
        token_ids,
        SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
        eos_token_ids=frozenset({EOS}),
    )


def feed(
    sched: Scheduler, out: SchedulerOutput, tokens: dict[str, int] | None = None
) -> list[SequenceUpdate]:
    """Hand-made model output: every sequence whose step reaches its end samples a token."""
    tokens = tokens or {}
    sampled = {
        s.request_id: [SampledToken(tokens.get(s.request_id, TOKEN), -0.5)]
        for s in out.scheduled
        if s.samples
    }
    return sched.update_from_output(out, ModelRunnerOutput(sampled))


def run_step(sched: Scheduler, tokens: dict[str, int] | None = None) -> SchedulerOutput:
    """One engine step: schedule, 'run the model', feed the samples back.

    ``start`` and ``samples`` of the returned items are stale (the sequences moved on).
    """
    out = sched.schedule()
    feed(sched, out, tokens)
    return out


def scheduled(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(s.request_id, s.num_new_tokens) for s in out.scheduled]


def used_blocks(sched: Scheduler) -> int:
    return sched.block_manager.num_used_blocks


# ---- basic flow ----


def test_prefill_then_decode() -> None:
    sched = make_scheduler()
    a = make_seq("a", 10)
    sched.queues.add(a)
    out = sched.schedule()
    (update,) = feed(sched, out)
    assert scheduled(out) == [("a", 10)]
    assert a.status == SequenceStatus.RUNNING
    assert a.num_computed_tokens == 10
    assert a.output_token_ids == [TOKEN]
    assert update.new_tokens == [SampledToken(TOKEN, -0.5)] and update.num_output_tokens == 1
    assert a.first_scheduled_time is not None
    assert update.first_scheduled_time == a.first_scheduled_time
    out = run_step(sched)
    assert scheduled(out) == [("a", 1)]
    assert a.num_computed_tokens == 11
    assert a.output_token_ids == [TOKEN, TOKEN]


def test_samples_flag_is_set_only_for_the_last_chunk() -> None:
    sched = make_scheduler(max_num_batched_tokens=4)
    sched.queues.add(make_seq("a", 6))
    out = sched.schedule()
    assert [s.samples for s in out.scheduled] == [False]
    sched.update_from_output(out, ModelRunnerOutput())
    out = sched.schedule()
    assert [(s.start, s.num_new_tokens, s.samples) for s in out.scheduled] == [(4, 2, True)]


def test_empty_schedule_when_idle() -> None:
    sched = make_scheduler()
    out = sched.schedule()
    assert out.is_empty and out.num_batched_tokens == 0
    assert not sched.queues.has_unfinished()


def test_running_sequences_are_scheduled_before_waiting_ones() -> None:
    sched = make_scheduler()
    sched.queues.add(make_seq("a", 5))
    run_step(sched)
    sched.queues.add(make_seq("b", 5))
    out = run_step(sched)
    assert scheduled(out) == [("a", 1), ("b", 5)]
    out = run_step(sched)
    assert scheduled(out) == [("a", 1), ("b", 1)]


def test_waiting_sequences_are_admitted_in_arrival_order() -> None:
    sched = make_scheduler(max_num_batched_tokens=10)
    for rid in "abc":
        sched.queues.add(make_seq(rid, 4))
    out = run_step(sched)
    assert scheduled(out) == [("a", 4), ("b", 4), ("c", 2)]


# ---- token budget and chunked prefill ----


def test_token_budget_is_respected() -> None:
    sched = make_scheduler(max_num_batched_tokens=16)
    for rid in "abcd":
        sched.queues.add(make_seq(rid, 10))
    for _ in range(8):
        out = run_step(sched)
        assert out.num_batched_tokens <= 16
    out = sched.schedule()
    assert out.num_batched_tokens <= 16


def test_budget_cuts_the_first_chunk_of_a_waiting_prompt() -> None:
    sched = make_scheduler(max_num_batched_tokens=16)
    sched.queues.add(make_seq("a", 10))
    sched.queues.add(make_seq("b", 10))
    sched.queues.add(make_seq("c", 10))
    out = run_step(sched)
    assert scheduled(out) == [("a", 10), ("b", 6)]
    assert [s.request_id for s in sched.queues.waiting] == ["c"]


def test_chunked_prefill_runs_beside_decodes() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    a = make_seq("a", 4)
    sched.queues.add(a)
    run_step(sched)  # a is decoding now
    b = make_seq("b", 20)
    sched.queues.add(b)
    progress = []
    for _ in range(3):
        out = run_step(sched)
        progress.append((scheduled(out), b.num_computed_tokens, b.num_output_tokens))
    assert progress == [
        ([("a", 1), ("b", 7)], 7, 0),
        ([("a", 1), ("b", 7)], 14, 0),
        ([("a", 1), ("b", 6)], 20, 1),  # the last chunk samples
    ]
    out = run_step(sched)
    assert scheduled(out) == [("a", 1), ("b", 1)]
    assert a.num_output_tokens == 5


def test_a_chunk_never_ends_inside_an_image_seen_both_ways() -> None:
    """Gemma 3's image tokens attend to each other both ways, so one step computes all
    of an image's: a chunk stops before it, and from its start waits for a step whose
    budget reaches its end (here, a running decode takes a token). A causal image
    (SmolVLM's) is split anywhere."""
    sched = make_scheduler(max_num_batched_tokens=8)
    a = make_seq("a", 4)
    sched.queues.add(a)
    run_step(sched)  # a is decoding now
    b = make_seq("b", 20)
    b.images = (ImageInput(1, None, tuple(range(5, 13)), bidirectional=True),)
    sched.queues.add(b)
    progress = [scheduled(run_step(sched)) for _ in range(4)]
    assert progress == [
        [("a", 1), ("b", 5)],  # up to the image (7 would cut it)
        [("a", 1)],  # 7 left of 8: the image's 8 tokens wait
        [("a", 1)],
        [("a", 1)],
    ]
    a.sampling_params = SamplingParams(max_tokens=a.num_output_tokens)  # a ends next
    assert scheduled(run_step(sched)) == [("a", 1)]
    assert [scheduled(run_step(sched)) for _ in range(2)] == [[("b", 8)], [("b", 7)]]
    causal = make_seq("c", 20)
    causal.images = (ImageInput(2, None, tuple(range(5, 13))),)
    sched.queues.add(causal)
    assert scheduled(run_step(sched))[-1] == ("c", 7)


def test_a_sequence_waiting_for_its_image_holds_up_none_after_it() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    a = make_seq("a", 4)
    sched.queues.add(a)
    run_step(sched)  # a is decoding now
    b, c = make_seq("b", 20), make_seq("c", 2)
    b.images = (ImageInput(1, None, tuple(range(5, 13)), bidirectional=True),)
    sched.queues.add(b)
    sched.queues.add(c)
    assert scheduled(run_step(sched)) == [("a", 1), ("b", 5), ("c", 2)]
    # 7 tokens left after a's: b waits for its image's 8, c still decodes.
    assert scheduled(run_step(sched)) == [("a", 1), ("c", 1)]


def test_a_long_prompt_alone_is_chunked_to_the_budget() -> None:
    sched = make_scheduler(max_num_batched_tokens=5)
    a = make_seq("a", 12)
    sched.queues.add(a)
    chunks = [scheduled(run_step(sched)) for _ in range(3)]
    assert chunks == [[("a", 5)], [("a", 5)], [("a", 2)]]
    assert a.num_output_tokens == 1
    assert len(a.block_table) == 3


def test_a_running_prefill_can_take_the_whole_budget() -> None:
    sched = make_scheduler(max_num_batched_tokens=4)
    sched.queues.add(make_seq("a", 12))
    sched.queues.add(make_seq("b", 2))
    out = run_step(sched)
    assert scheduled(out) == [("a", 4)]
    assert [s.request_id for s in sched.queues.waiting] == ["b"]


# ---- max_num_seqs ----


def test_max_num_seqs() -> None:
    sched = make_scheduler(max_num_seqs=2)
    seqs = [make_seq("a", 4, max_tokens=2), make_seq("b", 4, max_tokens=3), make_seq("c", 4)]
    for seq in seqs:
        sched.queues.add(seq)
    out = run_step(sched)
    assert scheduled(out) == [("a", 4), ("b", 4)]
    assert len(sched.queues.running) == 2
    out = run_step(sched)  # a reaches max_tokens and leaves
    assert scheduled(out) == [("a", 1), ("b", 1)]
    assert seqs[0].status == SequenceStatus.FINISHED_LENGTH
    out = run_step(sched)
    assert scheduled(out) == [("b", 1), ("c", 4)]


# ---- memory_threshold watermark ----


def test_watermark_holds_back_admission() -> None:
    # 10 blocks of 4 tokens, admission only while usage stays <= 50%.
    sched = make_scheduler(num_blocks=10, memory_threshold=0.5)
    sched.queues.add(make_seq("a", 16))  # 4 blocks
    sched.queues.add(make_seq("b", 8))  # 2 more would make 6 > 5
    out = run_step(sched)
    assert scheduled(out) == [("a", 16)]
    assert [s.request_id for s in sched.queues.waiting] == ["b"]
    assert sched.queues.waiting[0].block_table == []
    sched.queues.add(make_seq("c", 4))  # would fit, but admission is FIFO
    out = run_step(sched)
    assert scheduled(out) == [("a", 1)]


def test_watermark_admits_up_to_the_threshold() -> None:
    sched = make_scheduler(num_blocks=10, memory_threshold=0.5)
    sched.queues.add(make_seq("a", 12))  # 3 blocks
    sched.queues.add(make_seq("b", 8))  # 3 + 2 = 5 <= 5
    sched.queues.add(make_seq("c", 1))  # 6 > 5
    out = run_step(sched)
    assert scheduled(out) == [("a", 12), ("b", 8)]


def test_watermark_never_starves_a_lone_request() -> None:
    sched = make_scheduler(num_blocks=10, memory_threshold=0.5)
    big = make_seq("big", 32, max_tokens=2)  # 8 blocks: far over the watermark
    sched.queues.add(big)
    out = run_step(sched)
    assert scheduled(out) == [("big", 32)]
    assert used_blocks(sched) == 8


def test_watermark_request_runs_once_the_others_finish() -> None:
    sched = make_scheduler(num_blocks=10, memory_threshold=0.5)
    a = make_seq("a", 16, max_tokens=2)
    big = make_seq("big", 28, max_tokens=1)  # 7 blocks
    sched.queues.add(a)
    sched.queues.add(big)
    assert scheduled(run_step(sched)) == [("a", 16)]
    assert scheduled(run_step(sched)) == [("a", 1)]
    assert a.is_finished
    assert scheduled(run_step(sched)) == [("big", 28)]
    assert big.is_finished
    assert not sched.queues.has_unfinished()


# ---- preemption ----


def _fill_with_two_decoders(sched: Scheduler) -> tuple[Sequence, Sequence]:
    """Two sequences that fill a 4-block cache (block_size 4) after two steps."""
    a, b = make_seq("a", 7), make_seq("b", 7)
    sched.queues.add(a)
    sched.queues.add(b)
    assert scheduled(run_step(sched)) == [("a", 7), ("b", 7)]
    assert scheduled(run_step(sched)) == [("a", 1), ("b", 1)]
    assert sched.block_manager.num_free_blocks == 0
    # Both hold 9 tokens with 8 computed: position 8 needs a third block each.
    return a, b


def test_preempt_newest_by_recompute() -> None:
    sched = make_scheduler(num_blocks=4, enable_prefix_caching=False)
    a, b = _fill_with_two_decoders(sched)
    sched.queues.add(make_seq("c", 2))
    out = run_step(sched)
    assert out.preempted == [b.request_id]
    assert scheduled(out) == [("a", 1)]  # nothing is admitted in a step that preempted
    assert out.blocks_to_swap_out == []
    assert b.status == SequenceStatus.WAITING
    assert b.num_computed_tokens == 0
    assert b.block_table == []
    assert b.num_preemptions == 1 and sched.num_preemptions == 1
    assert [s.request_id for s in sched.queues.waiting] == ["b", "c"]  # back at the head
    assert b.output_token_ids == [TOKEN, TOKEN]  # its tokens are kept for the recompute
    assert used_blocks(sched) == 3


def test_recomputed_sequence_prefills_prompt_and_outputs_again() -> None:
    sched = make_scheduler(num_blocks=4, enable_prefix_caching=False)
    a, b = _fill_with_two_decoders(sched)
    a.sampling_params.max_tokens = 3
    run_step(sched)  # b preempted, a gets its third token and finishes
    assert a.status == SequenceStatus.FINISHED_LENGTH
    out = sched.schedule()
    assert scheduled(out) == [("b", 9)]  # 7 prompt + 2 output tokens
    assert out.scheduled[0].start == 0 and out.scheduled[0].samples
    feed(sched, out)
    assert b.num_output_tokens == 3


def test_recompute_victim_goes_ahead_of_waiting_requests() -> None:
    sched = make_scheduler(num_blocks=4, enable_prefix_caching=False)
    a, b = _fill_with_two_decoders(sched)
    a.sampling_params.max_tokens = 3
    c = make_seq("c", 2)
    sched.queues.add(c)
    run_step(sched)  # b preempted, a finishes
    out = run_step(sched)
    assert scheduled(out) == [("b", 9), ("c", 2)]


def test_preemption_with_prefix_caching_reuses_the_victims_blocks() -> None:
    sched = make_scheduler(num_blocks=5)
    a, b = make_seq("a", 11), make_seq("b", 3)
    sched.queues.add(a)
    sched.queues.add(b)
    run_step(sched)  # a: 3 blocks, b: 1 block; 1 free
    run_step(sched)  # b's first block is now full and cached
    assert b.num_computed_tokens == 4
    out = run_step(sched)  # a takes the last free block; b's position 4 finds none
    assert out.preempted == [b.request_id]
    assert scheduled(out) == [("a", 1)]
    a.sampling_params.max_tokens = a.num_output_tokens + 1
    out = run_step(sched)  # b's cached block alone does not get it admitted
    assert scheduled(out) == [("a", 1)]
    assert a.is_finished
    bm = sched.block_manager
    bm.prefix_hits = bm.prefix_queries = 0
    out = sched.schedule()
    assert scheduled(out) == [("b", 1)]  # 3 prompt + 2 output tokens, 4 from the cache
    assert out.scheduled[0].start == 4
    feed(sched, out)
    assert bm.memory_stats()["prefix_cache_hits"] == 4
    assert b.num_output_tokens == 3


def test_preempt_by_swap() -> None:
    sched = make_scheduler(num_blocks=4, num_cpu_blocks=8, use_swap=True)
    a, b = _fill_with_two_decoders(sched)
    gpu_table = list(b.block_table)
    out = run_step(sched)
    assert out.preempted == [b.request_id]
    assert scheduled(out) == [("a", 1)]
    assert b.status == SequenceStatus.SWAPPED
    assert list(sched.queues.swapped) == [b]
    assert b.num_computed_tokens == 8  # KV kept on the CPU
    assert [gpu for gpu, _ in out.blocks_to_swap_out] == gpu_table
    assert b.block_table == [cpu for _, cpu in out.blocks_to_swap_out]
    assert sched.block_manager.memory_stats()["cpu_used_blocks"] == 2
    assert sched.block_manager.memory_stats()["swapped_out_blocks"] == 2
    assert used_blocks(sched) == 3
    counts = {"num_sequences": 2, "num_running": 1, "num_waiting": 0, "num_swapped": 1}
    assert sched.queues.counts() == counts


def test_swapped_sequence_comes_back_before_waiting_ones() -> None:
    sched = make_scheduler(num_blocks=4, num_cpu_blocks=8, use_swap=True)
    a, b = _fill_with_two_decoders(sched)
    a.sampling_params.max_tokens = 4
    run_step(sched)  # b swapped out; a holds 3 blocks
    c = make_seq("c", 2)
    sched.queues.add(c)
    # One block is free: enough for c, not for b (which needs 3). c must wait.
    out = run_step(sched)
    assert scheduled(out) == [("a", 1)]
    assert a.status == SequenceStatus.FINISHED_LENGTH
    assert c.status == SequenceStatus.WAITING
    cpu_table = list(b.block_table)
    out = run_step(sched)
    assert scheduled(out) == [("b", 1), ("c", 2)]
    assert [cpu for cpu, _ in out.blocks_to_swap_in] == cpu_table
    assert b.block_table[:2] == [gpu for _, gpu in out.blocks_to_swap_in]
    assert len(b.block_table) == 3  # plus a new block for position 8
    assert b.status == SequenceStatus.RUNNING
    assert b.num_computed_tokens == 9
    assert not sched.queues.swapped
    assert sched.block_manager.memory_stats()["cpu_used_blocks"] == 0


def test_a_swapped_sequence_comes_back_on_the_budgets_last_token() -> None:
    sched = make_scheduler(num_blocks=4, num_cpu_blocks=8, use_swap=True)
    a, b = _fill_with_two_decoders(sched)
    a.sampling_params.max_tokens = 4
    run_step(sched)  # b swapped out
    run_step(sched)  # a ends
    sched.max_num_batched_tokens = 1
    assert scheduled(run_step(sched)) == [("b", 1)]


def test_several_victims_come_back_oldest_first() -> None:
    sched = make_scheduler(num_blocks=4, num_cpu_blocks=8, use_swap=True)
    a, b, c = make_seq("a", 7), make_seq("b", 3), make_seq("c", 3)
    for seq in (a, b, c):
        sched.queues.add(seq)
    run_step(sched)
    run_step(sched)  # all 4 blocks in use; a, b and c each need one more
    out = run_step(sched)
    assert out.preempted == [
        c.request_id,
        b.request_id,
    ]  # newest first, until a and then nothing else fits
    assert scheduled(out) == [("a", 1)]
    assert list(sched.queues.swapped) == [b, c]
    sched.queues.finish(a.request_id, SequenceStatus.FINISHED_ABORTED)
    out = run_step(sched)
    assert scheduled(out) == [("b", 1), ("c", 1)]


def test_swap_falls_back_to_recompute_without_cpu_space() -> None:
    sched = make_scheduler(num_blocks=4, num_cpu_blocks=1, use_swap=True)
    a, b = _fill_with_two_decoders(sched)
    out = run_step(sched)
    assert out.preempted == [b.request_id]
    assert out.blocks_to_swap_out == []
    assert b.status == SequenceStatus.WAITING
    assert b.num_computed_tokens == 0


def test_a_lone_sequence_that_cannot_grow_preempts_itself() -> None:
    sched = make_scheduler(num_blocks=2, max_model_len=1000, enable_prefix_caching=False)
    a = make_seq("a", 8)
    sched.queues.add(a)
    run_step(sched)
    out = run_step(sched)
    assert out.preempted == [a.request_id] and out.is_empty
    assert a.status == SequenceStatus.WAITING
    assert used_blocks(sched) == 0


def test_a_sequence_past_long_ropes_original_context_starts_again_long() -> None:
    """LongRoPE: a sequence that passes the original context while decoding is
    preempted by recompute, the others decoding in the same step, and comes back with
    the long factors, its whole KV computed again."""
    sched = make_scheduler(use_swap=True, num_cpu_blocks=8, long_rope_after=8)
    a, b = make_seq("a", 7), make_seq("b", 3)
    sched.queues.add(a)
    sched.queues.add(b)
    run_step(sched)
    run_step(sched)  # a holds 9 tokens now, 8 of them computed with the short factors
    out = run_step(sched)
    assert out.preempted == ["a"] and out.blocks_to_swap_out == []
    assert scheduled(out) == [("b", 1)]
    out = run_step(sched)
    assert scheduled(out) == [("b", 1), ("a", 9)] and a.long_rope


# ---- copy-on-write ----


def test_forked_sequences_copy_their_shared_partial_block() -> None:
    sched = make_scheduler()
    parent = make_seq("p", 6)
    sched.queues.add(parent)
    run_step(sched)  # 7 tokens, 6 computed: block 1 is partly filled
    child = make_seq("c", token_ids=parent.prompt_token_ids)
    child.token_ids = list(parent.token_ids)
    sched.block_manager.fork(parent, child)
    # n > 1 choices: the engine puts the twin straight into the batch.
    child.status = SequenceStatus.RUNNING
    sched.queues.running.append(child)
    sched.queues.sequences[child.request_id] = child
    full, shared = parent.block_table
    out = run_step(sched, {"p": 11, "c": 12})
    assert scheduled(out) == [("p", 1), ("c", 1)]
    assert len(out.blocks_to_copy) == 1
    src, dst = out.blocks_to_copy[0]
    assert src == shared and parent.block_table == [full, dst]
    assert child.block_table == [full, shared]  # the last holder writes in place
    assert parent.output_token_ids[-1] == 11 and child.output_token_ids[-1] == 12
    assert used_blocks(sched) == 3


def test_n_choices_fork_from_the_prompt_when_it_first_samples() -> None:
    sched = make_scheduler()
    parent = make_seq("p", 6)
    children = [make_seq(f"p#{i}", token_ids=parent.prompt_token_ids) for i in (1, 2)]
    parent.fork_children = children
    sched.queues.add(parent)
    run_step(sched, {"p": 11})
    # The children share the blocks of the first 5 prompt tokens and compute the 6th.
    first, second = parent.block_table
    assert sched.queues.running == [parent, *children]
    for child in children:
        assert child.status == SequenceStatus.RUNNING and child.num_computed_tokens == 5
        assert child.block_table == [first, second] and child.output_token_ids == []
    out = run_step(sched, {"p": 12, "p#1": 13, "p#2": 14})
    assert scheduled(out) == [("p", 1), ("p#1", 1), ("p#2", 1)]
    assert len(out.blocks_to_copy) == 2  # the shared partial block, copied on write
    assert [c.output_token_ids for c in children] == [[13], [14]]
    assert used_blocks(sched) == 4


def queue_choices_and_another(sched: Scheduler, n: int) -> Sequence:
    """Queue a request "p" of n choices (p, p#1, ...), then a lone one, "o": returns o."""
    parent, other = make_seq("p", 6), make_seq("o", 6)
    parent.fork_children = [
        make_seq(f"p#{i}", token_ids=parent.prompt_token_ids) for i in range(1, n)
    ]
    sched.queues.add(parent)
    sched.queues.add(other)
    return other


def test_n_choices_count_against_max_num_seqs_when_admitted() -> None:
    sched = make_scheduler(max_num_seqs=3)
    other = queue_choices_and_another(sched, 3)
    out = run_step(sched)
    assert scheduled(out) == [("p", 6)]  # its two choices to come take the other slots
    assert len(sched.queues.running) == 3 and list(sched.queues.waiting) == [other]
    sched.queues.finish("p#1", SequenceStatus.FINISHED_ABORTED)
    assert scheduled(run_step(sched))[-1] == ("o", 6)


def test_a_choice_aborted_before_the_fork_frees_its_slot() -> None:
    sched = make_scheduler(max_num_seqs=2)
    queue_choices_and_another(sched, 2)
    sched.queues.finish("p#1", SequenceStatus.FINISHED_ABORTED)
    assert scheduled(run_step(sched)) == [("p", 6), ("o", 6)]


def test_the_choices_after_one_aborted_before_the_fork_still_fork() -> None:
    sched = make_scheduler()
    queue_choices_and_another(sched, 3)
    sched.queues.finish("p#1", SequenceStatus.FINISHED_ABORTED)
    run_step(sched)
    assert [s.request_id for s in sched.queues.running] == ["p", "o", "p#2"]


def test_a_request_is_not_rejected_unstarted_once_its_first_choice_started() -> None:
    sched = make_scheduler(max_num_batched_tokens=4)
    queue_choices_and_another(sched, 2)
    run_step(sched)  # p's first chunk: p#1 forks from it once it samples
    assert sched.queues.reject_unstarted(["p", "p#1"]) == []
    assert "p#1" in sched.queues.sequences
    (rejected,) = sched.queues.reject_unstarted(["o"])
    assert rejected.request_id == "o" and rejected.finish_reason == "rejected"


def test_a_request_with_more_choices_than_max_num_seqs_runs_alone() -> None:
    sched = make_scheduler(max_num_seqs=2)
    other = queue_choices_and_another(sched, 3)
    run_step(sched)
    assert len(sched.queues.running) == 3 and list(sched.queues.waiting) == [other]


# ---- abort ----


def test_abort_waiting() -> None:
    sched = make_scheduler()
    a = make_seq("a", 5)
    sched.queues.add(a)
    sched.queues.finish(a.request_id, SequenceStatus.FINISHED_ABORTED)
    assert a.status == SequenceStatus.FINISHED_ABORTED
    assert a.status.finish_reason == "abort"
    assert a.finished_time is not None
    assert not sched.queues.has_unfinished()
    assert run_step(sched).is_empty


def test_abort_running_frees_blocks() -> None:
    sched = make_scheduler()
    a, b = make_seq("a", 10), make_seq("b", 5)
    sched.queues.add(a)
    sched.queues.add(b)
    run_step(sched)
    assert used_blocks(sched) == 5
    sched.queues.finish(a.request_id, SequenceStatus.FINISHED_ABORTED)
    assert a.block_table == []
    assert used_blocks(sched) == 2
    assert sched.queues.running == [b]
    assert scheduled(run_step(sched)) == [("b", 1)]


def test_abort_between_schedule_and_update() -> None:
    sched = make_scheduler()
    a, b = make_seq("a", 10), make_seq("b", 5)
    sched.queues.add(a)
    sched.queues.add(b)
    out = sched.schedule()
    sched.queues.finish(a.request_id, SequenceStatus.FINISHED_ABORTED)
    sampled = {"a": [SampledToken(TOKEN, 0.0)], "b": [SampledToken(TOKEN, 0.0)]}
    progressed = sched.update_from_output(out, ModelRunnerOutput(sampled))
    assert [u.request_id for u in progressed] == ["b"]
    assert a.output_token_ids == []
    assert a.num_computed_tokens == 0
    assert used_blocks(sched) == 2


def test_abort_swapped_frees_cpu_blocks() -> None:
    sched = make_scheduler(num_blocks=4, num_cpu_blocks=8, use_swap=True)
    a, b = _fill_with_two_decoders(sched)
    run_step(sched)
    assert b.status == SequenceStatus.SWAPPED
    sched.queues.finish(b.request_id, SequenceStatus.FINISHED_ABORTED)
    assert b.block_table == []
    assert not sched.queues.swapped
    assert sched.block_manager.memory_stats()["cpu_used_blocks"] == 0
    assert used_blocks(sched) == 3


def test_abort_preempted_waiting_sequence() -> None:
    sched = make_scheduler(num_blocks=4)
    a, b = _fill_with_two_decoders(sched)
    run_step(sched)
    assert b.status == SequenceStatus.WAITING
    sched.queues.finish(b.request_id, SequenceStatus.FINISHED_ABORTED)
    assert list(sched.queues.waiting) == []
    sched.queues.finish(a.request_id, SequenceStatus.FINISHED_ABORTED)
    assert used_blocks(sched) == 0
    assert not sched.queues.has_unfinished()


def test_abort_of_a_finished_sequence_is_a_no_op() -> None:
    sched = make_scheduler()
    a = make_seq("a", 3, max_tokens=1)
    sched.queues.add(a)
    run_step(sched)
    assert a.status == SequenceStatus.FINISHED_LENGTH
    sched.queues.finish(a.request_id, SequenceStatus.FINISHED_ABORTED)
    assert a.status == SequenceStatus.FINISHED_LENGTH


# ---- stop conditions ----


def test_finish_on_eos() -> None:
    sched = make_scheduler()
    a, b = make_seq("a", 5), make_seq("b", 5)
    sched.queues.add(a)
    sched.queues.add(b)
    run_step(sched)
    run_step(sched, {"a": EOS})
    assert a.status == SequenceStatus.FINISHED_STOPPED
    assert a.status.finish_reason == "stop"
    assert a.output_token_ids == [TOKEN, EOS]
    assert a.block_table == [] and a.finished_time is not None
    assert sched.queues.running == [b]
    assert used_blocks(sched) == 2


def test_eos_on_the_first_token() -> None:
    sched = make_scheduler()
    a = make_seq("a", 5)
    sched.queues.add(a)
    run_step(sched, {"a": EOS})
    assert a.status == SequenceStatus.FINISHED_STOPPED
    assert used_blocks(sched) == 0


def test_ignore_eos() -> None:
    sched = make_scheduler()
    a = make_seq("a", 5, max_tokens=3, ignore_eos=True)
    sched.queues.add(a)
    for _ in range(2):
        run_step(sched, {"a": EOS})
        assert a.status == SequenceStatus.RUNNING
    run_step(sched, {"a": EOS})
    assert a.status == SequenceStatus.FINISHED_LENGTH
    assert a.output_token_ids == [EOS, EOS, EOS]


def test_stop_token_ids_finish_with_a_stop_reason() -> None:
    sched = make_scheduler()
    a = make_seq("a", 5)
    a.sampling_params = SamplingParams(max_tokens=10, stop_token_ids=[9])
    sched.queues.add(a)
    run_step(sched)
    run_step(sched, {"a": 9})
    assert a.status == SequenceStatus.FINISHED_STOPPED and a.stop_reason == 9
    assert a.output_token_ids == [TOKEN, 9] and used_blocks(sched) == 0


def test_min_tokens_defers_eos_and_stop_tokens() -> None:
    sched = make_scheduler()
    a = make_seq("a", 5)
    a.sampling_params = SamplingParams(max_tokens=10, min_tokens=3, stop_token_ids=[9])
    sched.queues.add(a)
    run_step(sched, {"a": EOS})
    run_step(sched, {"a": 9})
    assert a.status == SequenceStatus.RUNNING
    run_step(sched, {"a": 9})  # the third token may stop it
    assert a.status == SequenceStatus.FINISHED_STOPPED and a.stop_reason == 9


def test_finish_on_max_tokens() -> None:
    sched = make_scheduler()
    a = make_seq("a", 5, max_tokens=3)
    sched.queues.add(a)
    run_step(sched)
    run_step(sched)
    assert a.status == SequenceStatus.RUNNING
    run_step(sched)
    assert a.status == SequenceStatus.FINISHED_LENGTH
    assert a.status.finish_reason == "length"
    assert a.num_output_tokens == 3
    assert used_blocks(sched) == 0
    assert not sched.queues.has_unfinished()


def test_finish_on_max_model_len() -> None:
    sched = make_scheduler(max_model_len=12)
    a = make_seq("a", 10, max_tokens=100)
    sched.queues.add(a)
    run_step(sched)
    assert a.status == SequenceStatus.RUNNING
    run_step(sched)
    assert a.status == SequenceStatus.FINISHED_LENGTH
    assert a.num_tokens == 12


def test_no_sample_no_stop_check() -> None:
    sched = make_scheduler(max_num_batched_tokens=4)
    a = make_seq("a", 6, max_tokens=1)
    sched.queues.add(a)
    run_step(sched, {"a": EOS})  # a chunk that does not reach the end samples nothing
    assert a.status == SequenceStatus.RUNNING
    assert a.num_output_tokens == 0


class CompletesAfter:
    """A constraint (response_format's) that is complete after ``length`` tokens."""

    def __init__(self, length: int) -> None:
        self.left = length

    def compute_bitmask(self) -> bytes:
        return b"every token allowed"

    def consume_token(self, token_id: int) -> bool:
        self.left -= 1
        return True

    def is_stopped(self) -> bool:
        return self.left <= 0


def test_a_constraint_ends_the_sequence_with_the_token_that_completes_it() -> None:
    sched = make_scheduler()
    seq = Sequence("g", [1000, 1001], SamplingParams(max_tokens=100), grammar=CompletesAfter(3))
    sched.queues.add(seq)
    for _ in range(3):
        run_step(sched)
    assert seq.output_token_ids == [TOKEN] * 3
    assert seq.status == SequenceStatus.FINISHED_STOPPED


# ---- prefix caching through the scheduler ----


def test_prefix_hit_shortens_the_first_chunk() -> None:
    sched = make_scheduler()
    shared = list(range(1, 11))  # 10 tokens: two full blocks of 4
    a = make_seq("a", token_ids=shared + [50, 51])
    sched.queues.add(a)
    run_step(sched)
    b = make_seq("b", token_ids=shared + [60, 61, 62])
    sched.queues.add(b)
    out = sched.schedule()
    assert scheduled(out) == [("a", 1), ("b", 5)]
    item = out.scheduled[1]
    assert item.start == 8 and item.samples
    feed(sched, out)
    assert b.block_table[:2] == a.block_table[:2]
    stats = sched.block_manager.memory_stats()
    assert stats["prefix_cache_queries"] == 12 + 13
    assert stats["prefix_cache_hits"] == 8
    assert stats["prefix_cache_hit_rate"] == 8 / 25


def test_a_block_filled_by_decoding_is_registered_in_the_step_that_fills_it() -> None:
    # A 6-token prompt (blocks of 4): its decode steps fill the second block at the
    # step that computes token 8 and the third at token 12, and only those steps add one.
    sched = make_scheduler()
    a = make_seq("a", 6)
    sched.queues.add(a)
    run_step(sched)  # the prompt: one full block
    assert (a.num_computed_tokens, a.num_registered_blocks) == (6, 1)
    registered = []
    for _ in range(7):
        run_step(sched)
        registered.append((a.num_computed_tokens, a.num_registered_blocks))
    assert registered == [(7, 1), (8, 2), (9, 2), (10, 2), (11, 2), (12, 3), (13, 3)]


def test_prefix_hit_after_the_first_request_finished() -> None:
    sched = make_scheduler()
    prompt = list(range(1, 14))
    a = make_seq("a", token_ids=prompt, max_tokens=1)
    sched.queues.add(a)
    run_step(sched)
    assert a.is_finished and used_blocks(sched) == 0
    b = make_seq("b", token_ids=prompt)
    sched.queues.add(b)
    out = sched.schedule()
    assert scheduled(out) == [("b", 1)]  # 12 of 13 tokens come from the cache
    assert out.scheduled[0].start == 12 and out.scheduled[0].samples


def test_prefix_hit_is_released_when_admission_fails() -> None:
    sched = make_scheduler(num_blocks=6, memory_threshold=0.5)
    prompt = list(range(1, 10))
    a = make_seq("a", token_ids=prompt)
    sched.queues.add(a)
    run_step(sched)  # a: 3 blocks, 2 of them cached
    b = make_seq("b", token_ids=prompt[:8] + list(range(100, 108)))  # 2 hit + 2 new
    sched.queues.add(b)
    out = run_step(sched)
    assert scheduled(out) == [("a", 1)]
    assert b.block_table == [] and b.num_computed_tokens == 0
    assert [sched.block_manager.blocks[i].ref_count for i in a.block_table] == [1, 1, 1]
    assert sched.block_manager.memory_stats()["prefix_cache_queries"] == 9


def test_prefix_hit_sizes_admission_by_the_remaining_tokens() -> None:
    # 4 blocks. a keeps 3 (two cached); b shares those two and needs only one more.
    sched = make_scheduler(num_blocks=4)
    prompt = list(range(1, 10))
    a = make_seq("a", token_ids=prompt)
    sched.queues.add(a)
    run_step(sched)
    b = make_seq("b", token_ids=prompt[:8] + [77, 78])
    sched.queues.add(b)
    out = run_step(sched)
    assert scheduled(out) == [("a", 1), ("b", 2)]
    assert used_blocks(sched) == 4
