"""n > 1 choices: forked from the prompt's KV blocks (copy-on-write), seeded per choice.

Choice i of a seeded request must equal a lone request seeded with seed + i: the
fork changes what is computed, never the result. And the group must hold fewer
KV blocks than n separate requests.
"""

from __future__ import annotations

import dataclasses

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.entrypoints.outputs import RequestOutput

from tests.tiny_models import save_tiny_model

PROMPT = list(range(5, 75))  # 70 tokens: 4 full blocks of 16 and a partial one
SEEDED = SamplingParams(n=4, max_tokens=12, temperature=1.0, seed=1234, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def make_engine(model_dir, **kw) -> LLMEngine:
    config = dict(model=str(model_dir), max_model_len=256, max_num_blocks=128, **kw)
    return LLMEngine(EngineConfig(**config))


def run_with_peak(engine: LLMEngine) -> tuple[dict[str, RequestOutput], int]:
    finals, peak = {}, 0
    while engine.has_pending_work():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        peak = max(peak, engine.memory_stats()["used_blocks"])
    return finals, peak


def test_choices_equal_lone_requests_seeded_seed_plus_i(model_dir):
    engine = make_engine(model_dir)
    outs = engine.generate(PROMPT, SEEDED, use_tqdm=False)
    assert [o.index for o in outs] == [0, 1, 2, 3]
    assert len({tuple(o.token_ids) for o in outs}) > 1  # the choices differ
    for i, out in enumerate(outs):
        alone = dataclasses.replace(SEEDED, n=1, seed=SEEDED.seed + i)
        assert out.token_ids == engine.generate(PROMPT, alone, use_tqdm=False)[0].token_ids
    assert engine.memory_stats()["used_blocks"] == 0


def test_choices_are_reproducible_and_independent_of_other_traffic(model_dir):
    first = [o.token_ids for o in make_engine(model_dir).generate(PROMPT, SEEDED, use_tqdm=False)]
    engine = make_engine(model_dir)
    other = SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True)
    engine.add_request([9, 8, 7, 6], other)
    request_id = engine.add_request(PROMPT, SEEDED)
    engine.add_request(PROMPT[:30], dataclasses.replace(other, n=3))
    finals, _ = run_with_peak(engine)
    group = sorted((o for o in finals.values() if o.group_id == request_id), key=lambda o: o.index)
    assert [o.token_ids for o in group] == first


def test_choices_count_against_max_num_seqs(model_dir):
    """As vLLM counts a request's n: the choices still to fork hold their slots, so the
    running sequences never outnumber max_num_seqs; and the choices come out the same."""
    first = [o.token_ids for o in make_engine(model_dir).generate(PROMPT, SEEDED, use_tqdm=False)]
    engine = make_engine(model_dir, max_num_seqs=5)
    short = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    engine.add_request(PROMPT[:30], dataclasses.replace(short, n=3))
    request_id = engine.add_request(PROMPT, SEEDED)
    finals, peak_running = {}, 0
    while engine.has_pending_work():
        finals.update((o.request_id, o) for o in engine.step() if o.finished)
        peak_running = max(peak_running, engine.memory_stats()["num_running"])
    assert peak_running == 4  # one group at a time: the second waits for the first
    group = sorted((o for o in finals.values() if o.group_id == request_id), key=lambda o: o.index)
    assert [o.token_ids for o in group] == first


def test_n_choices_use_fewer_blocks_than_separate_requests(model_dir):
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    # Without the prefix cache, so that only the fork can share blocks.
    engine = make_engine(model_dir, enable_prefix_caching=False)
    engine.add_request(PROMPT, dataclasses.replace(greedy, n=4))
    forked, forked_peak = run_with_peak(engine)
    for _ in range(4):
        engine.add_request(PROMPT, greedy)
    separate, separate_peak = run_with_peak(engine)
    # Separate: 80 tokens' KV at the fullest = 5 blocks of 16 each. Forked: the 4 full
    # prompt blocks are held once, and each choice has its own copy of the 5th.
    assert separate_peak == 4 * 5
    assert forked_peak == 4 + 4 * 1
    assert [o.token_ids for o in forked.values()] == [o.token_ids for o in separate.values()]
    assert engine.memory_stats()["used_blocks"] == 0


def test_abort_ends_every_choice(model_dir):
    engine = make_engine(model_dir)
    request_id = engine.add_request(PROMPT, SEEDED)
    engine.step()
    engine.step()
    assert engine.abort(request_id)
    assert not engine.has_pending_work()
    assert engine.memory_stats()["used_blocks"] == 0
    for i in range(4):
        out = engine.get_output(request_id if i == 0 else f"{request_id}#{i}")
        assert out.finished and out.finish_reason == "abort"


def test_first_token_stop_still_forks(model_dir):
    engine = make_engine(model_dir)
    outs = engine.generate(PROMPT, dataclasses.replace(SEEDED, max_tokens=1), use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [1, 1, 1, 1]
    assert engine.memory_stats()["used_blocks"] == 0
