"""Speculative decoding (n-gram drafts) on the tiny models, in fp32.

Greedy output equals transformers' token for token under every scheduling regime of
test_exactness (every regime on one model of each KV layout, one on each other family:
skip_outside_family_regimes), with drafts proposed, accepted and rejected (a logit bias makes the
random models repeat themselves, which the proposer picks up). With sampling features
(penalties, logprobs, stop tokens and strings, min_tokens, max_tokens, n > 1, seeds)
the tokens are the same with and without drafts. Unseeded sampling keeps the target
distribution: the first tokens' frequencies with and without drafts agree, and a
verifier that accepts drafts it should not is caught by the same check.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.worker import step_sampling

from tests.engine.test_exactness import EOS, REGIMES, skip_outside_family_regimes
from tests.reference import check_same_tokens, transformers_greedy
from tests.tiny_models import TINY_MODELS, save_tiny_model

SPEC = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
MAX_NEW_TOKENS = 32


def repeated_span_prompts(seed: int, vocab: int) -> list[list[int]]:
    """Prompts made of a random span repeated, then a random tail: proposals from the
    first decode step on."""
    rng = random.Random(seed)
    shapes = [(3, 4, 0), (5, 3, 2), (8, 3, 5), (12, 2, 1), (6, 5, 3), (20, 3, 7), (4, 10, 0)]
    prompts = []
    for span_len, repeats, tail in shapes:
        span = [rng.randrange(3, vocab) for _ in range(span_len)]
        prompts.append(span * repeats + [rng.randrange(3, vocab) for _ in range(tail)])
    prompts.append([rng.randrange(3, vocab) for _ in range(40)])  # nothing to copy
    return prompts


# A logit bias that keeps greedy output to three tokens: the random models then repeat
# themselves, so drafts are accepted (and, as they do not repeat exactly, rejected too).
# Without it they seldom repeat, and drafts are mostly rejected.
LOOPING_BIAS = {7: 100.0, 77: 100.0, 177: 100.0}


@pytest.fixture(scope="module", params=sorted(TINY_MODELS))
def tiny(request, tmp_path_factory):
    """(model folder, prompts, their params, transformers' greedy outputs) per
    architecture: every prompt plain and with LOOPING_BIAS."""
    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    prompts = repeated_span_prompts(3, TINY_MODELS[request.param]().vocab_size)
    params, expected = greedy_with_and_without_loops(folder, prompts)
    return folder, prompts * 2, params, expected


def greedy_with_and_without_loops(
    folder, prompts: list[list[int]]
) -> tuple[list[SamplingParams], list[list[int]]]:
    """Greedy params for every prompt plain, then with LOOPING_BIAS, and transformers'
    outputs for them."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    expected = []
    for bias in ({}, LOOPING_BIAS):
        sequence_bias = [[[t], b] for t, b in bias.items()] or None
        expected += transformers_greedy(
            model.eval(),
            prompts,
            MAX_NEW_TOKENS,
            batch_size=len(prompts),
            eos_token_id=EOS,
            pad_token_id=0,
            sequence_bias=sequence_bias,
        )
    params = [
        SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, logit_bias=bias)
        for bias in ({}, LOOPING_BIAS)
        for _ in prompts
    ]
    return params, expected


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_greedy_with_drafts_matches_transformers(tiny, regime, request):
    family = request.node.callspec.params["tiny"]
    skip_outside_family_regimes(family, regime, sorted(TINY_MODELS))
    folder, prompts, params, expected = tiny
    settings, must_happen = REGIMES[regime]
    config = EngineConfig(model=str(folder), dtype="float32", speculative_config=SPEC, **settings)
    engine = LLMEngine(config)
    # The second pass finds the first pass's blocks in the prefix cache.
    for _ in range(2):
        outputs = engine.generate(prompts, params, use_tqdm=False)
        for prompt, param, out, ref in zip(prompts, params, outputs, expected, strict=True):
            check_same_tokens(folder, prompt, out.token_ids, ref, param.logit_bias)
            if out.token_ids == ref:
                assert out.finish_reason == ("stop" if ref[-1] == EOS else "length")
    spec = engine.metrics.spec_decode
    assert spec.num_accepted_tokens > 0, "no draft was ever accepted: nothing was tested"
    assert spec.num_draft_tokens > spec.num_accepted_tokens, "no draft was ever rejected"
    assert sum(spec.accepted_per_position) == spec.num_accepted_tokens
    check_regime_ran_and_freed(engine, must_happen)


def check_regime_ran_and_freed(engine: LLMEngine, must_happen: str | None) -> None:
    """Whole drafts were accepted, the regime's event happened, the prefix cache was
    hit, and every block and sequence is gone."""
    assert engine.metrics.spec_decode.accepted_per_position[-1] > 0
    if must_happen:
        assert engine.metrics.as_dict()[must_happen] > 0
    stats = engine.memory_stats()
    assert stats["prefix_cache_hits"] > 0
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0


# ---- sampling features: the same tokens with and without drafts ----


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def _engines(folder, **settings) -> tuple[LLMEngine, LLMEngine]:
    config = EngineConfig(model=str(folder), dtype="float32", **settings)
    return LLMEngine(config), LLMEngine(config.replace(speculative_config=SPEC))


def _feature_cases(prompts, greedy_outputs) -> list[tuple[list[int], SamplingParams]]:
    """Per prompt, sampling features over greedy or seeded runs; its stop token and stop
    string come from its plain greedy output, so that they end it mid-way."""
    cases = []
    for i, (prompt, out) in enumerate(zip(prompts, greedy_outputs, strict=True)):
        base = SamplingParams(max_tokens=MAX_NEW_TOKENS, logprobs=2, temperature=0.0)
        stop_token = out.token_ids[min(9, len(out.token_ids) - 1)]
        params = [
            dataclasses.replace(base, stop_token_ids=[stop_token]),
            dataclasses.replace(base, repetition_penalty=1.3, presence_penalty=0.4),
            dataclasses.replace(base, min_tokens=6, max_tokens=13),
            dataclasses.replace(base, temperature=0.8, top_k=40, seed=i, n=2),
            dataclasses.replace(base, temperature=1.0, top_p=0.9, seed=100 + i, logprobs=None),
        ]
        if len(out.text) > 12:
            params.append(dataclasses.replace(base, stop=[out.text[8:11]]))
        cases += [(prompt, p) for p in params]
    return cases


def test_sampling_features_give_the_same_tokens_with_drafts(llama_folder):
    plain, speculative = _engines(llama_folder)
    prompts = repeated_span_prompts(5, TINY_MODELS["llama"]().vocab_size)
    greedy_params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0)
    greedy = plain.generate(prompts, greedy_params, use_tqdm=False)
    cases = _feature_cases(prompts, greedy)
    case_prompts = [prompt for prompt, _ in cases]
    case_params = [params for _, params in cases]
    expected = plain.generate(case_prompts, case_params, use_tqdm=False)
    got = speculative.generate(case_prompts, case_params, use_tqdm=False)
    assert len(got) == len(expected)
    for out, ref in zip(got, expected, strict=True):
        assert out.token_ids == ref.token_ids, ref.request_id
        assert out.text == ref.text
        assert (out.finish_reason, out.stop_reason) == (ref.finish_reason, ref.stop_reason)
        if ref.logprobs is not None:
            assert len(out.logprobs) == len(ref.logprobs)
            for mine, theirs in zip(out.logprobs, ref.logprobs, strict=True):
                assert mine.keys() == theirs.keys()
                assert all(abs(mine[t] - theirs[t]) < 1e-4 for t in mine)
    assert speculative.metrics.spec_decode.num_accepted_tokens > 0
    assert speculative.memory_stats()["used_blocks"] == 0


# ---- the sampled distribution ----

# A few tokens the logit bias makes likely (the rest is ~never drawn), in a repeating
# prompt, so each position's draft is one of them and is accepted at times, not always.
CANDIDATES = [10, 20, 30, 40]
BIASED = {t: 60.0 for t in CANDIDATES}
NUM_SAMPLES = 1000


def _first_tokens(engine: LLMEngine, temperature: float) -> list[tuple[int, ...]]:
    prompt = CANDIDATES * 6
    params = SamplingParams(max_tokens=4, temperature=temperature, logit_bias=BIASED)
    outputs = engine.generate([prompt] * NUM_SAMPLES, params, use_tqdm=False)
    return [tuple(o.token_ids) for o in outputs]


def _chi_square(a: Counter, b: Counter) -> tuple[float, int]:
    """Pearson's two-sample statistic and its degrees of freedom; outcomes seen fewer
    than 10 times in all are pooled, where the statistic's approximation holds."""
    rare = {key for key in set(a) | set(b) if a[key] + b[key] < 10}
    a = Counter({k: v for k, v in a.items() if k not in rare}) + Counter(
        {"rare": sum(a[k] for k in rare)}
    )
    b = Counter({k: v for k, v in b.items() if k not in rare}) + Counter(
        {"rare": sum(b[k] for k in rare)}
    )
    keys = list(set(a) | set(b))
    na, nb = sum(a.values()), sum(b.values())
    statistic = 0.0
    for key in keys:
        total = a[key] + b[key]
        for count, n in ((a[key], na), (b[key], nb)):
            expected = total * n / (na + nb)
            statistic += (count - expected) ** 2 / expected
    return statistic, max(len(keys) - 1, 1)


# Pearson's chi-square at p = 0.001, by degrees of freedom.
CRITICAL_001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12}
CRITICAL_001 |= {9: 27.88, 10: 29.59, 11: 31.26, 12: 32.91, 13: 34.53, 14: 36.12, 15: 37.70}
CRITICAL_001 |= {16: 39.25}


def _worst_position(plain: list[tuple[int, ...]], drafted: list[tuple[int, ...]]) -> float:
    """The largest statistic / critical value over positions 1-3 (drafts start at 1)
    and over (token 1, token 2) pairs: above 1 means the distributions differ."""
    ratios = []
    for key in (lambda t: t[1], lambda t: t[2], lambda t: t[3], lambda t: t[1:3]):
        a = Counter(key(t) for t in plain if len(t) == 4)
        b = Counter(key(t) for t in drafted if len(t) == 4)
        statistic, dof = _chi_square(a, b)
        ratios.append(statistic / CRITICAL_001[dof])
    return max(ratios)


@pytest.fixture(scope="module")
def sampled_plain(llama_folder):
    plain, speculative = _engines(llama_folder)
    return plain, speculative, _first_tokens(plain, 2.0)


def test_sampling_with_drafts_keeps_the_distribution(sampled_plain):
    _, speculative, plain_tokens = sampled_plain
    drafted = _first_tokens(speculative, 2.0)
    spec = speculative.metrics.spec_decode
    # The check only means something where drafts were both accepted and rejected often.
    assert 0.1 < spec.acceptance_rate < 0.9, spec
    assert _worst_position(plain_tokens, drafted) < 1.0


def test_the_distribution_check_catches_a_verifier_that_accepts_a_few_drafts_too_many(
    sampled_plain, monkeypatch
):
    """A verifier that also keeps a quarter of the drafts it should reject."""
    _, speculative, plain_tokens = sampled_plain
    rng = random.Random(0)

    def lenient(drafts, picks):
        n = 0
        while n < len(drafts) and (picks[n] == drafts[n] or rng.random() < 0.25):
            n += 1
        return n + 1

    monkeypatch.setattr(step_sampling, "num_kept", lenient)
    drafted = _first_tokens(speculative, 2.0)
    assert _worst_position(plain_tokens, drafted) > 1.0
