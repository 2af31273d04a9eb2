"""Beam search (engine/entrypoints/beam_search.py) equals transformers' generate(num_beams=...), all
beams and their order, in fp32; width 1 equals greedy; the rounds leave no KV block
held, and take every full block of a beam's prefix from the prefix cache.

The tiny Llama here ends its text with token 251 as well as 2: 251 is among the
candidates a beam weighs at many steps, so that hypotheses end by eos at different
lengths and early_stopping changes the answer (asserted, so the test cannot pass
without it).
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams, ValidationError
from hetero_infer.engine.entrypoints.beam_search import (
    BeamSearch,
    BeamSearchParams,
    num_candidates,
)
from hetero_infer.engine.entrypoints.outputs import RequestMetrics
from hetero_infer.engine.params.sampling_params import MAX_LOGPROBS

from tests.tiny_models import TINY_MODELS, save_tiny_model

FREQUENT_EOS = 251
MAX_NEW_TOKENS = 20
BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"), eos_token_id=FREQUENT_EOS)


@pytest.fixture(scope="module")
def engine(folder) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", block_size=BLOCK_SIZE))


@pytest.fixture(scope="module")
def reference(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(0)
    vocab = TINY_MODELS["llama"]().vocab_size
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in (1, 5, 17, 40)]


@torch.no_grad()
def transformers_beams(model, prompt, eos, width, **kwargs) -> tuple[list[list[int]], list[float]]:
    """transformers' width beams of ``prompt``, best first, each cut after its eos, and
    their scores."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
        num_beams=width,
        num_return_sequences=width,
        eos_token_id=sorted(eos),
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    beams = []
    for row in out.sequences.tolist():
        generated = row[len(prompt) :]
        ends = [i for i, token in enumerate(generated) if token in eos]
        beams.append(generated[: ends[0] + 1] if ends else generated)
    return beams, out.sequences_scores.tolist()


SETTINGS = [
    dict(length_penalty=1.0, early_stopping=False),
    dict(length_penalty=1.0, early_stopping=True),
    dict(length_penalty=0.5, early_stopping="never"),
    dict(length_penalty=-1.0, early_stopping=False),
    dict(length_penalty=2.0, early_stopping=True),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_width_4_matches_transformers(engine, reference, prompts, settings):
    eos = engine.tokenizer.eos_token_ids
    params = BeamSearchParams(beam_width=4, max_tokens=MAX_NEW_TOKENS, **settings)
    outputs = engine.beam_search(prompts, params)
    assert len(outputs) == 4 * len(prompts)
    ended_by_eos = 0
    for i, prompt in enumerate(prompts):
        mine = outputs[4 * i : 4 * (i + 1)]
        expected, scores = transformers_beams(reference, prompt, eos, 4, **settings)
        assert [out.token_ids for out in mine] == expected, f"prompt {i}"
        assert [out.index for out in mine] == [0, 1, 2, 3]
        penalty = settings["length_penalty"]
        mine_scores = [o.cumulative_logprob / len(o.token_ids) ** penalty for o in mine]
        assert mine_scores == pytest.approx(scores, rel=1e-5, abs=1e-4)
        for out in mine:
            by_eos = out.token_ids[-1] in eos
            ended_by_eos += by_eos
            assert out.finish_reason == ("stop" if by_eos else "length")
            assert by_eos or len(out.token_ids) == MAX_NEW_TOKENS
    assert ended_by_eos >= 3  # eos handling is exercised
    assert engine.memory_stats()["used_blocks"] == 0


def test_early_stopping_changes_the_answer(engine, prompts):
    """The settings above are not all alike: with eos this frequent, stopping once 4
    hypotheses have ended gives shorter beams than waiting for better ones."""
    answers = {}
    for early in (True, False, "never"):
        params = BeamSearchParams(beam_width=4, max_tokens=MAX_NEW_TOKENS, early_stopping=early)
        answers[early] = [out.token_ids for out in engine.beam_search(prompts, params)]
    assert answers[True] != answers[False]


def test_width_1_is_greedy(engine, prompts):
    greedy = engine.generate(
        prompts, SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0), use_tqdm=False
    )
    beams = engine.beam_search(prompts, BeamSearchParams(beam_width=1, max_tokens=MAX_NEW_TOKENS))
    assert [b.token_ids for b in beams] == [g.token_ids for g in greedy]
    assert [b.finish_reason for b in beams] == [g.finish_reason for g in greedy]
    assert [b.text for b in beams] == [g.text for g in greedy]
    assert any(g.finish_reason == "stop" for g in greedy)  # an eos among them


def test_text_prompt_and_ignore_eos(engine):
    params = BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True)
    outputs = engine.beam_search("hello there", params)
    assert len(outputs) == 2
    assert all(len(o.token_ids) == 6 and o.finish_reason == "length" for o in outputs)
    assert outputs[0].prompt_token_ids == engine.tokenizer.encode("hello there")


def test_rounds_take_full_blocks_from_the_prefix_cache(engine):
    """Each round recomputes only a beam's partly filled last block (and its new
    token): at most block_size tokens per beam per round, whatever the prompt's length."""
    prompt = list(range(3, 3 + 5 * BLOCK_SIZE + 3))  # 5 full blocks and 3 tokens
    manager = engine.block_manager
    queried, hit = manager.prefix_queries, manager.prefix_hits
    params = BeamSearchParams(beam_width=4, max_tokens=12, ignore_eos=True)
    engine.beam_search([prompt], params)
    computed = (manager.prefix_queries - queried) - (manager.prefix_hits - hit)
    num_rounds = 12
    beam_requests = 1 + 4 * (num_rounds - 1)
    # The first round computes the prompt (its blocks may be cached from before).
    assert computed <= len(prompt) + (beam_requests - 1) * BLOCK_SIZE
    assert computed < (manager.prefix_queries - queried) / 4  # most tokens come cached
    assert engine.memory_stats()["used_blocks"] == 0


def test_width_is_bounded_by_the_logprobs_a_round_computes(engine):
    # Two eos tokens: each beam weighs (1 + 2) * width candidates, at most 20.
    with pytest.raises(ValidationError) as error:
        engine.beam_search([[5, 6]], BeamSearchParams(beam_width=7, max_tokens=4))
    assert error.value.param == "n"
    assert len(engine.beam_search([[5, 6]], BeamSearchParams(beam_width=6, max_tokens=2))) == 6


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (dict(beam_width=0), "n"),
        (dict(beam_width=True), "n"),
        (dict(beam_width=2.0), "n"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=True), "max_tokens"),
        (dict(max_tokens=4.0), "max_tokens"),
        (dict(length_penalty=True), "length_penalty"),
        (dict(length_penalty="1"), "length_penalty"),
        (dict(length_penalty=float("inf")), "length_penalty"),
        (dict(early_stopping="sometimes"), "early_stopping"),
        (dict(early_stopping=1), "early_stopping"),
        (dict(length_penalty=float("nan")), "length_penalty"),
    ],
)
def test_bad_params_name_their_field(fields, param):
    with pytest.raises(ValidationError) as error:
        BeamSearchParams(**fields)
    assert error.value.param == param


def test_one_token_of_one_beam_is_a_search():
    search = BeamSearch([9], BeamSearchParams(beam_width=1, max_tokens=1), {0})
    search.advance([{4: -0.5, 5: -1.0}])
    assert search.done and [(h.token_ids, h.finish_reason) for h in search.finished] == [
        ((4,), "length")
    ]


@pytest.mark.parametrize(
    ("fields", "eos", "expected"),
    [
        ({}, [0], 6),  # eos and one more per beam: at least 2 per beam
        ({}, [0, 1], 9),  # (1 + 2 ending tokens) per beam
        ({"ignore_eos": True}, [0, 1], 6),
        ({"stop_token_ids": (5,)}, [0, 1], 12),
        ({"stop_token_ids": (0,)}, [0], 6),  # eos and a stop token alike: one ending token
    ],
)
def test_candidates_per_round(fields, eos, expected):
    assert num_candidates(BeamSearchParams(beam_width=3, **fields), eos) == expected


def test_candidates_per_round_are_the_logprobs_a_request_may_ask():
    assert num_candidates(BeamSearchParams(beam_width=10), [0]) == MAX_LOGPROBS
    with pytest.raises(ValidationError) as error:
        num_candidates(BeamSearchParams(beam_width=11), [0])
    assert error.value.param == "n"


def test_search_scores_as_transformers_on_hand_made_logprobs():
    """Without a model: two beams, eos = 0. The best candidate ends at once; the search
    goes on with the next ones, and stops (early_stopping=True) once two have ended."""
    search = BeamSearch([9], BeamSearchParams(beam_width=2, max_tokens=5, early_stopping=True), {0})
    assert search.prompts() == [[9]]
    search.advance([{0: -0.1, 1: -0.5, 2: -1.0, 3: -3.0}])
    assert [h.token_ids for h in search.finished] == [(0,)]
    assert search.prompts() == [[9, 1], [9, 2]]
    search.advance([{0: -0.2, 4: -2.0, 5: -3.0, 6: -4.0}, {0: -5.0, 7: -0.1, 8: -6, 3: -7}])
    assert search.done  # two hypotheses: (0,) and (1, 0)
    assert [h.token_ids for h in search.finished] == [(0,), (1, 0)]
    assert search.finished[1].score == pytest.approx((-0.5 - 0.2) / 2)
    assert [h.finish_reason for h in search.finished] == ["stop", "stop"]


@pytest.mark.parametrize(
    ("early_stopping", "done"),
    [(True, True), (False, True), ("never", False)],
)
def test_when_the_search_may_still_improve(early_stopping, done):
    """Width 1, eos = 0, length_penalty 2: the first round ends the hypothesis (0,),
    scored -0.1, and beam (1,) at -0.5 goes on. At its length it cannot beat -0.1;
    with "never", at max_tokens (5) it could: -0.5 / 5**2 = -0.02."""
    params = BeamSearchParams(
        beam_width=1, max_tokens=5, length_penalty=2.0, early_stopping=early_stopping
    )
    search = BeamSearch([9], params, {0})
    search.advance([{0: -0.1, 1: -0.5}])
    assert [(h.token_ids, h.score) for h in search.finished] == [((0,), -0.1)]
    assert search.done == done


def test_a_search_cut_short_keeps_its_live_beams_best_first():
    search = BeamSearch([9], BeamSearchParams(beam_width=2, max_tokens=5), {0})
    search.advance([{1: -0.5, 2: -0.1, 3: -2.0, 4: -3.0}])
    search.cut_short("abort")
    assert search.done and search.prompts() == []
    finished = [(h.token_ids, h.finish_reason) for h in search.finished]
    assert finished == [((2,), "abort"), ((1,), "abort")]


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_tokens_text_is_shown_only_when_asked(engine, include):
    params = BeamSearchParams(
        beam_width=1, max_tokens=4, stop_token_ids=(70,), include_stop_str_in_output=include
    )
    search = BeamSearch([9], params, {0})
    search.advance([{65: -0.1, 66: -1.0}])
    search.advance([{70: -0.1, 66: -1.0}])
    [output] = search.outputs("r", None, engine.tokenizer, RequestMetrics(arrival_time=0.0))
    assert (output.token_ids, output.finish_reason, output.stop_reason) == ([65, 70], "stop", 70)
    shown = [65, 70] if include else [65]
    assert output.text == engine.tokenizer.decode(shown)
