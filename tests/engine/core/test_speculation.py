"""Speculative decoding's parts on their own: the config, the n-gram proposer, the
draft length's back-off, the verifier's rows, and the scheduler's drafts and rollback."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest
import torch
from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.draft_length import MAX_PAUSE, DraftLength
from hetero_infer.engine.core.ngram_proposer import NgramProposer, TokenText
from hetero_infer.engine.core.scheduler import Scheduler
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.core.speculator import Speculator
from hetero_infer.engine.core.step_data import (
    DRAFT_PLACEHOLDER,
    ModelRunnerOutput,
    SampledToken,
    SchedulerOutput,
)
from hetero_infer.engine.core.step_records import schedule_entry
from hetero_infer.engine.params.sampling_params import SamplingParams
from hetero_infer.engine.params.thinking_budget import ThinkingBudget
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.engine.settings.speculative_config import SpeculativeConfig
from hetero_infer.engine.worker.randomness import Randomness
from hetero_infer.engine.worker.rejection import rejection_sample
from hetero_infer.engine.worker.verifier import num_kept, verification_rows
from hetero_infer.kernels.philox import uniforms_ref
from hetero_infer.server import cli

# ---- config ----


def test_config_from_vllm_json():
    config = EngineConfig(
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 5,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    )
    assert config.speculative == SpeculativeConfig(5, prompt_lookup_min=2, prompt_lookup_max=4)
    assert EngineConfig().speculative is None
    # One bound given: the other follows it.
    only_max = SpeculativeConfig.from_dict({"num_speculative_tokens": 3, "prompt_lookup_max": 1})
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (1, 1)
    only_min = SpeculativeConfig.from_dict({"num_speculative_tokens": 3, "prompt_lookup_min": 6})
    assert (only_min.prompt_lookup_min, only_min.prompt_lookup_max) == (6, 6)
    # vLLM's draft form: a "model" with no method, or method "draft_model".
    draft = SpeculativeConfig(3, method="draft_model", model="small")
    assert SpeculativeConfig.from_dict({"model": "small", "num_speculative_tokens": 3}) == draft
    explicit = {"method": "draft_model", "model": "small", "num_speculative_tokens": 3}
    assert SpeculativeConfig.from_dict(explicit) == draft
    assert draft.uses_draft_model and not config.speculative.uses_draft_model
    quantized = SpeculativeConfig.from_dict({**explicit, "quantization": "none"})
    assert quantized.quantization == "none"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1], "must be a JSON object"),
        ({"method": "ngram"}, "num_speculative_tokens is required"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "method must be one of ngram, draft"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
        ({"model": "", "num_speculative_tokens": 2}, "needs 'model'"),
        (
            {"model": "d", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
            "is for method 'ngram'",
        ),
        (
            {"method": "ngram", "model": "d", "num_speculative_tokens": 2},
            "'model' is for method 'draft_model'",
        ),
        ({"model": "d", "num_speculative_tokens": 2, "quantization": "fp4"}, "quantization must"),
        ({"model": "d"}, "num_speculative_tokens is required"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens must be an integer"),
        ({"num_speculative_tokens": 2.5}, "num_speculative_tokens must be an integer"),
        ({"num_speculative_tokens": True}, "num_speculative_tokens must be an integer"),
        ({"num_speculative_tokens": 2, "prompt_lookup_min": 0}, "prompt_lookup_min"),
        (
            {"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 3},
            "must not exceed",
        ),
        ({"num_speculative_tokens": 2, "lookahead": 3}, "unknown key 'lookahead'"),
        ({"num_speculative_tokens": 2, "disable_by_batch_size": 0}, "disable_by_batch_size"),
        ({"model": "d", "num_speculative_tokens": 2, "disable_by_batch_size": "8"}, "disable_by"),
    ],
)
def test_invalid_configs_are_refused_at_start_up(values, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(speculative_config=values)


def test_the_cli_flag_and_environment_take_the_json():
    parser = cli.build_serve_parser()
    text = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}'
    config = cli.engine_config_from_args(parser.parse_args(["--speculative-config", text]), {})
    assert config.speculative == SpeculativeConfig(3, prompt_lookup_min=2, prompt_lookup_max=2)
    empty = parser.parse_args([])
    from_env = cli.engine_config_from_args(empty, {"HETERO_SPECULATIVE_CONFIG": text})
    assert from_env.speculative == config.speculative
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        cli.engine_config_from_args(
            parser.parse_args(["--speculative-config", '{"method": "ngram"}']), {}
        )
    with pytest.raises(SystemExit):  # not JSON: argparse says so
        parser.parse_args(["--speculative-config", "ngram"])
    assert isinstance(parser, argparse.ArgumentParser)


# ---- the n-gram proposer ----


def _text(tokens: list[int]) -> str:
    return TokenText().sync(tokens)


def test_proposer_continues_the_most_recent_earlier_occurrence():
    proposer = NgramProposer(min_n=1, max_n=3)
    # "5 6" occurs twice before the end; the later one is followed by 9.
    tokens = [5, 6, 7, 1, 5, 6, 9, 8, 2, 5, 6]
    assert proposer.propose(_text(tokens), 3) == [9, 8, 2]
    assert proposer.propose(_text(tokens), 1) == [9]


def test_proposer_prefers_the_longest_match():
    proposer = NgramProposer(min_n=1, max_n=3)
    # The 1-gram "3" last occurred before 4; the 3-gram "1 2 3" before 7.
    tokens = [1, 2, 3, 7, 7, 3, 4, 1, 2, 3]
    assert proposer.propose(_text(tokens), 2) == [7, 7]
    assert NgramProposer(min_n=1, max_n=1).propose(_text(tokens), 2) == [4, 1]


def test_proposer_repeats_a_pattern_and_finds_nothing_without_a_match():
    proposer = NgramProposer(min_n=2, max_n=4)
    # Past the end of what followed, the pattern repeats at the same distance.
    assert proposer.propose(_text([1, 2, 3, 1, 2]), 5) == [3, 1, 2, 3, 1]
    assert proposer.propose(_text([7, 7, 7, 7]), 3) == [7, 7, 7]
    assert proposer.propose(_text([1, 2, 3, 4, 5]), 5) == []
    assert proposer.propose(_text([1, 2, 1]), 5) == []  # only 1-grams would match


def test_token_text_grows_with_the_tokens_and_takes_any_vocabulary_id():
    text = TokenText()
    tokens = [0, 151_935, 0xD800, 5]
    assert [ord(c) for c in text.sync(tokens[:2])] == tokens[:2]
    assert [ord(c) for c in text.sync(tokens)] == tokens


# ---- the draft length ----


def test_draft_length_backs_off_on_misses_and_recovers_on_hits():
    length = DraftLength(max_tokens=4)
    assert length.next() == 4
    length.record(4, 0)
    assert length.next() == 2
    length.record(2, 0)
    assert length.next() == 1
    length.record(1, 0)  # at zero: a pause of 1 step, then one token
    assert [length.next(), length.next()] == [0, 1]
    length.record(1, 0)  # the pause doubles with each further miss
    assert [length.next() for _ in range(3)] == [0, 0, 1]
    length.record(1, 1)  # a hit: doubles, pauses reset
    assert length.next() == 2
    length.record(2, 2)
    assert length.next() == 4
    length.record(4, 4)
    assert length.next() == 4  # never past the configured length
    length.record(4, 1)
    assert length.next() == 2  # what was accepted, plus one
    length.record(2, 1)
    assert length.next() == 2
    # A partial hit resets the pauses too: the next misses pause from one step again.
    length.record(2, 0)
    length.record(1, 0)
    assert [length.next(), length.next()] == [0, 1]


def test_a_sequence_that_always_misses_drafts_rarely():
    length = DraftLength(max_tokens=5)
    drafted = 0
    for _ in range(1000):
        k = length.next()
        if k:
            drafted += k
            length.record(k, 0)
    assert drafted < 1000 / MAX_PAUSE * 2 + 20


# ---- verification ----


def _decoding_seq(params: SamplingParams, prompt: list[int], output: list[int]) -> Sequence:
    seq = Sequence("r", prompt, params, eos_token_ids=frozenset({0}))
    seq.token_ids += output
    seq.num_computed_tokens = seq.num_tokens - 1
    return seq


def test_verification_rows_are_the_steps_plain_decoding_would_have_had():
    params = SamplingParams(presence_penalty=0.5, temperature=0.5, seed=1)
    seq = _decoding_seq(params, [1, 2, 3], [4, 5])
    item = schedule_entry(seq, 1, [6, 7])
    assert item.token_ids == [5, 6, 7] and item.sample_position == 5
    rows = verification_rows(item)
    assert len(rows) == 3
    for j, row in enumerate(rows):
        seq_then = _decoding_seq(params, [1, 2, 3], [4, 5, 6, 7][: 2 + j])
        plain = schedule_entry(seq_then, 1)
        assert row.sample_position == plain.sample_position == 5 + j
        assert row.output_token_ids == plain.output_token_ids
        assert row.prompt_token_ids == plain.prompt_token_ids
        assert row.draft_token_ids == ()
    assert verification_rows(schedule_entry(seq, 1)) == [schedule_entry(seq, 1)]


def test_num_kept_keeps_confirmed_drafts_and_one_more():
    assert num_kept([], [9]) == 1
    assert num_kept([1, 2, 3], [1, 2, 3, 4]) == 4
    assert num_kept([1, 2, 3], [1, 5, 3, 4]) == 2
    assert num_kept([1, 2, 3], [7, 2, 3, 4]) == 1


# ---- the scheduler: drafts within limits, rollback of rejected ones ----


def _scheduler(num_blocks: int = 16, budget: int = 64, k: int = 4) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, block_size=4),
        max_num_seqs=8,
        max_num_batched_tokens=budget,
        max_model_len=64,
        speculator=Speculator(SpeculativeConfig(k, prompt_lookup_min=1, prompt_lookup_max=2)),
    )


def _step(sched: Scheduler, keep: int, token: int = 3):
    """Schedule and apply a step whose model keeps ``keep`` drafts, then says ``token``."""
    out = sched.schedule()
    sampled = {
        s.request_id: [SampledToken(t, -1.0) for t in [*s.draft_token_ids[:keep], token]]
        for s in out.scheduled
        if s.samples
    }
    return out, sched.update_from_output(out, ModelRunnerOutput(sampled))


def _start(sched: Scheduler, seq: Sequence, first_token: int) -> None:
    """Add a sequence and run its prefill (in chunks, if the budget says so)."""
    sched.queues.add(seq)
    while seq.num_output_tokens == 0:
        _step(sched, keep=0, token=first_token)


def test_disable_by_batch_size_is_taken_by_both_methods():
    ngram = {"num_speculative_tokens": 3, "disable_by_batch_size": 4}
    assert SpeculativeConfig.from_dict(ngram) == SpeculativeConfig(3, disable_by_batch_size=4)
    draft = SpeculativeConfig.from_dict({**ngram, "model": "small"})
    assert draft.uses_draft_model and draft.disable_by_batch_size == 4
    assert "off above 4 running requests" in draft.describe()
    assert SpeculativeConfig.from_dict({"num_speculative_tokens": 3}).disable_by_batch_size is None


def test_no_drafts_while_more_requests_run_than_disable_by_batch_size():
    config = SpeculativeConfig(4, prompt_lookup_min=1, prompt_lookup_max=2, disable_by_batch_size=1)
    sched = _scheduler()
    sched.speculator = Speculator(config)
    first = Sequence("a", [1, 2, 3, 1, 2, 3, 1], SamplingParams(max_tokens=20))
    _start(sched, first, first_token=2)
    out, _ = _step(sched, keep=0)  # one running request: it drafts
    assert out.scheduled[0].draft_token_ids
    second = Sequence("b", [1, 2, 3, 1, 2, 3, 1], SamplingParams(max_tokens=20))
    _start(sched, second, first_token=2)
    for _ in range(3):  # two running: none drafts
        out, _ = _step(sched, keep=0)
        assert len(out.scheduled) == 2
        assert all(not item.draft_token_ids for item in out.scheduled)


def test_rejected_drafts_give_their_blocks_back_and_are_never_cached():
    sched = _scheduler()
    bm = sched.block_manager
    seq = Sequence("a", [1, 2, 3, 1, 2, 3, 1], SamplingParams(max_tokens=20))
    _start(sched, seq, first_token=2)
    out, _ = _step(sched, keep=0)  # drafts [3, 1, 2, 3], none kept; the model says 3
    (item,) = out.scheduled
    assert item.draft_token_ids == (3, 1, 2, 3) and item.num_new_tokens == 5
    assert seq.token_ids[7:] == [2, 3]
    assert seq.num_computed_tokens == seq.num_tokens - 1 == 8
    # 12 slots were taken for the step; the third block held only rejected drafts.
    assert len(seq.block_table) == 2 and bm.num_used_blocks == 2
    # Only full blocks of computed tokens are in the prefix cache.
    cached = {bm.blocks[b].token_ids for b in bm.cached_blocks.values()}
    assert cached == {(1, 2, 3, 1), (2, 3, 1, 2)}
    out, _ = _step(sched, keep=2)  # a partial acceptance moves the KV on by 1 + 2
    assert seq.num_computed_tokens == seq.num_tokens - 1 == 11
    assert len(seq.block_table) == 3


def test_drafts_stay_within_the_budget_max_tokens_and_the_free_blocks():
    sched = _scheduler(budget=3)
    seq = Sequence("a", [1, 2, 1, 2, 1, 2, 1, 2], SamplingParams(max_tokens=20))
    _start(sched, seq, first_token=1)
    out, _ = _step(sched, keep=0)
    assert out.scheduled[0].num_draft_tokens == 2  # budget 3: its own token and 2 drafts

    sched = _scheduler(budget=2)
    seq = Sequence("a", [1, 2, 1, 2, 1, 2, 1, 2], SamplingParams(max_tokens=20))
    _start(sched, seq, first_token=1)
    out, _ = _step(sched, keep=0)
    assert out.scheduled[0].num_draft_tokens == 1

    sched = _scheduler()
    seq = Sequence("a", [1, 2] * 30, SamplingParams(max_tokens=20))
    _start(sched, seq, first_token=1)
    out, _ = _step(sched, keep=5)
    assert out.scheduled[0].num_draft_tokens == 2  # 61 tokens of max_model_len's 64
    assert seq.is_finished and seq.num_tokens == 64

    sched = _scheduler()
    seq = Sequence("a", [1, 2, 1, 2, 1, 2, 1, 2], SamplingParams(max_tokens=3))
    _start(sched, seq, first_token=1)
    out, _ = _step(sched, keep=5)
    assert out.scheduled[0].num_draft_tokens == 1  # 2 outputs left: one draft at most
    assert seq.is_finished and seq.num_output_tokens == 3

    sched = _scheduler(num_blocks=3)  # 12 slots: 8 computed, the newest token and 3 more
    seq = Sequence("a", [1, 2, 1, 2, 1, 2, 1, 2], SamplingParams(max_tokens=20))
    _start(sched, seq, first_token=1)
    out, _ = _step(sched, keep=5)
    assert out.scheduled[0].num_draft_tokens == 3
    assert not out.preempted


def test_a_stop_token_among_accepted_drafts_ends_the_sequence_there():
    sched = _scheduler()
    params = SamplingParams(max_tokens=20, stop_token_ids=[1])
    seq = Sequence("a", [1, 2, 3, 1, 2, 3, 1], params)
    _start(sched, seq, first_token=2)
    out, (update,) = _step(sched, keep=4)  # drafts [3, 1, 2, 3], all confirmed
    assert seq.output_token_ids == [2, 3, 1]
    assert update.finish_reason == "stop" and update.stop_reason == 1
    assert [t.token_id for t in update.new_tokens] == [3, 1]
    assert sched.block_manager.num_used_blocks == 0


def test_no_drafts_before_min_tokens_or_with_a_grammar():
    sched = _scheduler()
    seq = Sequence("a", [1, 2, 1, 2, 1, 2], SamplingParams(max_tokens=20, min_tokens=3))
    _start(sched, seq, first_token=1)
    drafts = [_step(sched, keep=5)[0].scheduled[0].num_draft_tokens for _ in range(3)]
    assert drafts[:2] == [0, 0] and drafts[2] > 0  # from 3 outputs on
    for grammar, drafted in ((None, True), (object(), False)):
        seq = Sequence("b", [1, 2, 1, 2], SamplingParams(max_tokens=20), grammar=grammar)
        seq.token_ids.append(1)
        seq.num_computed_tokens = seq.num_tokens - 1
        assert Speculator.may_draft(seq) is drafted


@pytest.mark.parametrize(
    ("params", "drafted"),
    [
        ({"bad_words_token_ids": [[5]]}, True),  # one token: the same mask at every draft
        ({"bad_words_token_ids": [[5], [6, 7]]}, False),  # 7's ban depends on the token before
        ({"thinking_budget": ThinkingBudget(4, (5,), (6,))}, False),
    ],
)
def test_no_drafts_where_a_mask_depends_on_the_tokens_before(params, drafted):
    """The verifier's rows share the step's masks, right only where a draft cannot
    change them."""
    seq = Sequence("a", [1, 2, 1, 2], SamplingParams(max_tokens=20, **params))
    seq.token_ids.append(1)
    seq.num_computed_tokens = seq.num_tokens - 1
    assert Speculator.may_draft(seq) is drafted


# ---- the scheduler with a draft model ----


def _draft_scheduler(k: int = 3) -> Scheduler:
    config = SpeculativeConfig(k, method="draft_model", model="draft")
    return Scheduler(
        BlockManager(16, block_size=4),
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=64,
        speculator=Speculator(config),
    )


def _draft_step(sched: Scheduler, keep: int, token: int = 3):
    """A step whose draft model proposes 5, 6, 7... and whose target keeps ``keep``."""
    out = sched.schedule()
    sampled = {}
    for s in out.scheduled:
        proposed = [5 + j for j in range(s.num_draft_tokens)]
        if s.samples:
            sampled[s.request_id] = [SampledToken(t, -1.0) for t in [*proposed[:keep], token]]
    sched.update_from_output(out, ModelRunnerOutput(sampled))
    return out


def test_a_draft_model_prefills_alongside_and_catches_up_on_what_it_lags_by():
    sched = _draft_scheduler(k=3)
    seq = Sequence("a", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=30))
    sched.queues.add(seq)
    (item,) = _draft_step(sched, keep=0).scheduled  # the prompt: the draft runs it too
    assert item.draft_lag_token_ids == () and item.draft_token_ids == ()
    assert seq.num_draft_computed_tokens == seq.num_computed_tokens == 6
    (item,) = _draft_step(sched, keep=3).scheduled  # 3 slots, every draft accepted
    assert item.draft_token_ids == (DRAFT_PLACEHOLDER,) * 3 and item.draft_lag_token_ids == ()
    # The draft ran on the newest token and the drafts but the last: one behind.
    assert seq.num_computed_tokens == 10 and seq.num_draft_computed_tokens == 9
    (item,) = _draft_step(sched, keep=0).scheduled
    assert item.draft_lag_token_ids == (7,)  # the last accepted draft, computed first now
    assert seq.num_computed_tokens == seq.num_draft_computed_tokens == 11
    # Nothing accepted: the draft length halves, then pauses; steps without drafts
    # leave the draft model out, and it falls behind by a token each.
    lags = []
    for _ in range(4):
        item = _draft_step(sched, keep=0).scheduled[0]
        lags.append(None if item.draft_lag_token_ids is None else len(item.draft_lag_token_ids))
    assert None in lags
    assert seq.num_draft_computed_tokens < seq.num_computed_tokens
    # Preempted (by recompute), it comes back with its cached blocks, which hold both
    # models' KV, and the draft model recomputes the rest alongside the target.
    sched._preempt(seq, SchedulerOutput())
    assert seq.num_computed_tokens == 0 and sched.block_manager.num_used_blocks == 0
    (item,) = _draft_step(sched, keep=0).scheduled
    assert item.start > 0 and item.start % 4 == 0 and item.draft_lag_token_ids == ()
    assert seq.num_draft_computed_tokens == seq.num_computed_tokens


def test_n_choices_fork_with_the_draft_model_level_with_the_target():
    sched = _draft_scheduler(k=3)
    parent = Sequence("a", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=30, n=2))
    child = Sequence("b", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=30))
    parent.fork_children = [child]
    sched.queues.add(parent)
    _draft_step(sched, keep=0)
    # The child shares the prompt's blocks but its last token, and both models' KV.
    assert child.num_computed_tokens == child.num_draft_computed_tokens == 5
    items = {s.request_id: s for s in _draft_step(sched, keep=0).scheduled}
    assert items["b"].start == 5 and items["b"].draft_lag_token_ids == ()


def test_blocks_enter_the_prefix_cache_once_the_draft_model_has_them_too():
    sched = _draft_scheduler(k=3)
    bm = sched.block_manager
    seq = Sequence("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=30))
    sched.queues.add(seq)
    _draft_step(sched, keep=0)  # prompt [1..5] + 3: one full block
    assert len(bm.cached_blocks) == 1
    _draft_step(sched, keep=3)  # [.. 3, 5, 6, 7] + 3: tokens 0-8 computed, the draft's 0-7
    assert seq.num_computed_tokens == 9 and seq.num_draft_computed_tokens == 8
    assert len(bm.cached_blocks) == 2  # blocks 0-3 and 4-7, both models complete
    _draft_step(sched, keep=3)
    assert seq.num_computed_tokens == 13 and seq.num_draft_computed_tokens == 12
    assert len(bm.cached_blocks) == 3


# ---- rejection sampling against a draft model's probabilities ----


def test_rejection_sampling_gives_the_target_distribution_whatever_the_draft():
    target = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])  # a draft position, then the next
    draft = torch.tensor([[0.1, 0.1, 0.8]])  # proposes token 2 far too often
    generator = torch.Generator().manual_seed(0)
    randomness = Randomness(0, uniforms_ref)
    n = 20_000
    first, accepted = Counter(), 0
    for _ in range(n):
        proposed = int(torch.multinomial(draft[0], 1, generator=generator))
        kept = rejection_sample(target, draft, [proposed], 9, None, 10, randomness)
        first[kept[0]] += 1
        accepted += len(kept) == 2
        assert kept[1:] in ([], [9])  # the target's own next token only after an accept
    assert [round(first[t] / n, 2) for t in range(3)] == pytest.approx([0.5, 0.3, 0.2], abs=0.015)
    # Accepted with probability sum(min(p, q)) = 0.1 + 0.1 + 0.2.
    assert accepted / n == pytest.approx(0.4, abs=0.015)


def test_each_draft_is_tested_at_its_own_position():
    """Two drafts at once decide as two one-draft calls at their positions would: the
    second is tested after the first is accepted, and each accept test and residual
    draw is keyed by its own position."""
    target = torch.tensor([[0.3, 0.3, 0.4], [0.3, 0.3, 0.4], [0.2, 0.2, 0.6]])
    draft = torch.tensor([[0.1, 0.1, 0.8], [0.1, 0.1, 0.8]])
    shared = Randomness(0, uniforms_ref)
    outcomes = Counter()
    for seed in range(60):
        both = rejection_sample(target, draft, [2, 2], 9, seed, 10, shared)
        first = rejection_sample(target[:2], draft[:1], [2], -1, seed, 10, shared)
        if first[0] != 2:  # the first draft rejected: the same replacement
            assert both == first
            continue
        second = rejection_sample(target[1:], draft[1:], [2], 9, seed, 11, shared)
        assert both == [2, *second]
        outcomes[second[0] == 2] += 1
    assert outcomes[True] and outcomes[False]  # the second draft both kept and replaced


def test_seeded_rejection_sampling_repeats_itself():
    target = torch.tensor([[0.5, 0.3, 0.2], [0.3, 0.3, 0.4], [0.2, 0.2, 0.6]])
    draft = torch.tensor([[0.1, 0.1, 0.8], [0.1, 0.1, 0.8]])
    shared = Randomness(0, uniforms_ref)

    def run(seed: int) -> list[list[int]]:
        return [rejection_sample(target, draft, [2, 2], 0, seed, p, shared) for p in range(50)]

    assert run(1) == run(1) != run(2)
