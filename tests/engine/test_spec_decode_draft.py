"""Speculative decoding with a draft model, on the tiny models in fp32.

Greedy output equals transformers' token for token under the scheduling regimes of
test_exactness (chunked prefill, preemption by recompute and by swap, prefix-cache
hits on the second pass; every regime on one model of each KV layout, one on each
other family: skip_outside_family_regimes), with a perturbed copy of the target as the
draft (drafts partly accepted) and, on the models of each KV layout, the target itself
(nearly every draft accepted: whole drafts and their bonus tokens). With sampling
features the greedy tokens are plain decoding's, seeded sampling repeats itself, and
the logprobs of rejection-sampled tokens are the target's. Sampling keeps the target's
distribution with a draft whose distribution differs (a chi-square test that a
verifier accepting every draft fails), with temperature and bias and with each of
top-k, top-p, min-p and the presence, frequency and repetition penalties. A draft
model with another vocabulary, tokenizer or length is refused at start-up.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.engine.worker import step_sampling

from tests.engine.test_exactness import (
    EOS,
    EVERY_REGIME,
    REGIMES,
    skip_outside_family_regimes,
)
from tests.engine.test_spec_decode import (
    BIASED,
    CANDIDATES,
    LOOPING_BIAS,
    _worst_position,
    check_regime_ran_and_freed,
    greedy_with_and_without_loops,
    repeated_span_prompts,
)
from tests.helpers import make_byte_fallback_tokenizer
from tests.reference import check_same_tokens
from tests.tiny_models import TINY_MODELS, save_perturbed_copy, save_tiny_model

K = 4
MAX_NEW_TOKENS = 32
# Noise on the draft's weights, relative to each weight's spread: at 0.1 the tiny
# models' drafts are accepted about half the time (with LOOPING_BIAS or few candidates).
PERTURBATION = 0.1
DRAFTS = ("itself", "perturbed")


def spec(draft) -> dict:
    return {"model": str(draft), "num_speculative_tokens": K}


@pytest.fixture(scope="module", params=sorted(TINY_MODELS))
def tiny(request, tmp_path_factory):
    """(target folder, {draft kind: folder}, prompts, params, transformers' greedy
    outputs) per architecture: every prompt plain and with LOOPING_BIAS."""
    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    perturbed = save_perturbed_copy(folder, tmp_path_factory.mktemp("draft"), PERTURBATION)
    prompts = repeated_span_prompts(3, TINY_MODELS[request.param]().vocab_size)
    params, expected = greedy_with_and_without_loops(folder, prompts)
    drafts = {"itself": folder, "perturbed": perturbed}
    return folder, drafts, prompts * 2, params, expected


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_greedy_with_a_draft_model_matches_transformers(tiny, regime, draft, request):
    family = request.node.callspec.params["tiny"]
    skip_outside_family_regimes(family, regime, sorted(TINY_MODELS))
    if draft == "itself" and family not in EVERY_REGIME:
        pytest.skip("the target as its own draft is accepted whole whatever the family")
    folder, drafts, prompts, params, expected = tiny
    settings, must_happen = REGIMES[regime]
    config = EngineConfig(
        model=str(folder), dtype="float32", speculative_config=spec(drafts[draft]), **settings
    )
    engine = LLMEngine(config)
    # The second pass finds the first pass's blocks (both models' KV) in the prefix cache.
    for _ in range(2):
        outputs = engine.generate(prompts, params, use_tqdm=False)
        for prompt, param, out, ref in zip(prompts, params, outputs, expected, strict=True):
            check_same_tokens(folder, prompt, out.token_ids, ref, param.logit_bias)
            if out.token_ids == ref:
                assert out.finish_reason == ("stop" if ref[-1] == EOS else "length")
    stats = engine.metrics.spec_decode
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens
    if draft == "itself":
        assert stats.acceptance_rate > 0.95, stats
    else:
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, stats
    check_regime_ran_and_freed(engine, must_happen)


# ---- sampling features ----


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    """(target folder, perturbed draft folder) of the tiny Llama."""
    folder = save_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    return folder, save_perturbed_copy(folder, tmp_path_factory.mktemp("draft"), PERTURBATION)


def _feature_cases(prompts, greedy_outputs) -> list[tuple[list[int], SamplingParams]]:
    """Per prompt: greedy rows with a stop token and a stop string from its plain
    output, penalties, min_tokens and n = 2, then seeded sampling rows."""
    cases = []
    for i, (prompt, out) in enumerate(zip(prompts, greedy_outputs, strict=True)):
        base = SamplingParams(max_tokens=MAX_NEW_TOKENS, logprobs=2, temperature=0.0)
        stop_token = out.token_ids[min(9, len(out.token_ids) - 1)]
        params = [
            dataclasses.replace(base, stop_token_ids=[stop_token]),
            dataclasses.replace(base, repetition_penalty=1.3, presence_penalty=0.4),
            dataclasses.replace(base, min_tokens=6, max_tokens=13, logit_bias=LOOPING_BIAS),
            dataclasses.replace(base, n=2, logit_bias=LOOPING_BIAS),
            dataclasses.replace(base, temperature=0.8, top_k=40, seed=i, n=2),
            dataclasses.replace(base, temperature=1.0, seed=100 + i, logit_bias=BIASED),
            dataclasses.replace(base, temperature=1.0, top_p=0.9, seed=200 + i, logprobs=None),
        ]
        if len(out.text) > 12:
            params.append(dataclasses.replace(base, stop=[out.text[8:11]]))
        cases += [(prompt, p) for p in params]
    return cases


def test_sampling_features_with_a_draft_model(llama_pair):
    folder, draft = llama_pair
    config = EngineConfig(model=str(folder), dtype="float32")
    plain = LLMEngine(config)
    prompts = repeated_span_prompts(5, TINY_MODELS["llama"]().vocab_size)
    greedy = plain.generate(prompts, SamplingParams(max_tokens=MAX_NEW_TOKENS), use_tqdm=False)
    cases = _feature_cases(prompts, greedy)
    case_prompts = [prompt for prompt, _ in cases]
    case_params = [params for _, params in cases]
    expected = plain.generate(case_prompts, case_params, use_tqdm=False)
    runs = []
    for _ in range(2):  # two engines: seeded sampling must repeat itself
        speculative = LLMEngine(config.replace(speculative_config=spec(draft)))
        runs.append(speculative.generate(case_prompts, case_params, use_tqdm=False))
        assert speculative.metrics.spec_decode.num_accepted_tokens > 0
        assert speculative.memory_stats()["used_blocks"] == 0
    got, again = runs
    # n = 2 gives two outputs side by side.
    output_params = [params for params in case_params for _ in range(params.n)]
    assert len(got) == len(again) == len(expected) == len(output_params)
    for out, repeat, ref, params in zip(got, again, expected, output_params, strict=True):
        assert out.token_ids == repeat.token_ids and out.text == repeat.text
        if params.temperature == 0.0:  # greedy: plain decoding's tokens
            assert out.token_ids == ref.token_ids, ref.request_id
            assert out.text == ref.text
            assert (out.finish_reason, out.stop_reason) == (ref.finish_reason, ref.stop_reason)
        if out.logprobs is not None and not params.has_penalties and not params.logit_bias:
            _check_logprobs(plain, out)


def _check_logprobs(plain: LLMEngine, out) -> None:
    """Each reported logprob is the target's for that token: the plain engine's prompt
    logprobs of the prompt followed by the output agree (requests without penalties
    or bias, whose logprobs are the model's raw distribution)."""
    assert len(out.logprobs) == len(out.token_ids)
    for token, logprobs in zip(out.token_ids, out.logprobs, strict=True):
        assert token in logprobs and len(logprobs) >= 2
    prompt = list(out.prompt_token_ids) + list(out.token_ids)
    (scored,) = plain.generate(
        [prompt], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )
    reference = scored.prompt_logprobs[len(out.prompt_token_ids) :]
    for token, mine, theirs in zip(out.token_ids, out.logprobs, reference, strict=True):
        assert abs(mine[token] - theirs[token]) < 1e-4


# ---- the sampled distribution ----

NUM_SAMPLES = 1000


def _first_tokens(engine: LLMEngine) -> list[tuple[int, ...]]:
    prompt = CANDIDATES * 6
    params = SamplingParams(max_tokens=4, temperature=2.0, logit_bias=BIASED)
    outputs = engine.generate([prompt] * NUM_SAMPLES, params, use_tqdm=False)
    return [tuple(o.token_ids) for o in outputs]


@pytest.fixture(scope="module")
def engines(llama_pair) -> tuple[LLMEngine, LLMEngine]:
    """(plain, speculative) engines of the tiny Llama, its perturbed copy the draft."""
    folder, draft = llama_pair
    config = EngineConfig(model=str(folder), dtype="float32")
    return LLMEngine(config), LLMEngine(config.replace(speculative_config=spec(draft)))


@pytest.fixture(scope="module")
def sampled(engines):
    plain, speculative = engines
    return speculative, _first_tokens(plain)


def test_sampling_with_a_draft_model_keeps_the_distribution(sampled):
    speculative, plain_tokens = sampled
    drafted = _first_tokens(speculative)
    stats = speculative.metrics.spec_decode
    # Only meaningful where the draft's distribution differs from the target's: drafts
    # both accepted and rejected often.
    assert 0.1 < stats.acceptance_rate < 0.9, stats
    assert _worst_position(plain_tokens, drafted) < 1.0


def test_the_distribution_check_catches_accepting_every_draft(sampled, monkeypatch):
    """A verifier that keeps every draft gives the draft's distribution, not the
    target's."""
    speculative, plain_tokens = sampled

    def accept_all(target_probs, draft_probs, drafts, bonus, *args):
        return [*drafts, bonus]

    monkeypatch.setattr(step_sampling, "rejection_sample", accept_all)
    assert _worst_position(plain_tokens, _first_tokens(speculative)) > 1.0


# Each sampling feature on its own, set so that it moves the distribution a lot: the
# verifier must apply it to the target's distribution as plain sampling does (a
# verifier that left it out gives a distribution these tests tell apart). The
# truncations at a high temperature, where they cut off a candidate often drawn
# without them. The penalties after a prompt of other tokens: they fall on the tokens
# the output has drawn so far, drafts among them (a candidate in the prompt would be
# penalised the same way at every position).
OTHER_TOKENS = [50, 60, 70, 80]
FEATURES = {
    "top_k": (CANDIDATES * 6, {"temperature": 4.0, "top_k": 2}),
    "top_p": (CANDIDATES * 6, {"temperature": 2.0, "top_p": 0.5}),
    "min_p": (CANDIDATES * 6, {"temperature": 4.0, "min_p": 0.3}),
    "presence_penalty": (OTHER_TOKENS * 6, {"temperature": 1.5, "presence_penalty": 2.0}),
    "frequency_penalty": (OTHER_TOKENS * 6, {"temperature": 1.5, "frequency_penalty": 2.0}),
    "repetition_penalty": (OTHER_TOKENS * 6, {"temperature": 2.0, "repetition_penalty": 1.1}),
}
# Half the samples of the check above, to keep six cases quick: each feature moves the
# distribution far enough that a verifier accepting every draft, or leaving the
# feature out, still fails by a wide margin.
FEATURE_SAMPLES = 500


def _feature_tokens(
    engine: LLMEngine, prompt: list[int], **settings: float
) -> list[tuple[int, ...]]:
    params = SamplingParams(max_tokens=4, logit_bias=BIASED, **settings)
    outputs = engine.generate([prompt] * FEATURE_SAMPLES, params, use_tqdm=False)
    return [tuple(o.token_ids) for o in outputs]


@pytest.fixture(scope="module", params=sorted(FEATURES))
def feature(request, engines):
    """(speculative engine, prompt, sampling settings, plain engine's tokens with them)
    per feature."""
    plain, speculative = engines
    prompt, settings = FEATURES[request.param]
    return speculative, prompt, settings, _feature_tokens(plain, prompt, **settings)


def test_each_feature_moves_the_distribution(feature, engines):
    """Plain sampling without the feature draws a distribution the check tells apart:
    what a verifier that leaves the feature out would draw at drafted positions."""
    _, prompt, settings, plain_tokens = feature
    temperature_only = {"temperature": settings["temperature"]}
    without = _feature_tokens(engines[0], prompt, **temperature_only)
    assert _worst_position(plain_tokens, without) > 1.0


def test_sampling_with_a_draft_model_keeps_each_features_distribution(feature):
    speculative, prompt, settings, plain_tokens = feature
    before = dataclasses.replace(speculative.metrics.spec_decode)
    drafted = _feature_tokens(speculative, prompt, **settings)
    after = speculative.metrics.spec_decode
    # Drafts both accepted and rejected often, in this feature's requests.
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    rate = accepted / (after.num_draft_tokens - before.num_draft_tokens)
    assert 0.1 < rate < 0.9, rate
    assert _worst_position(plain_tokens, drafted) < 1.0


def test_the_check_catches_accepting_every_draft_with_each_feature(feature, monkeypatch):
    speculative, prompt, settings, plain_tokens = feature

    def accept_all(target_probs, draft_probs, drafts, bonus, *args):
        return [*drafts, bonus]

    monkeypatch.setattr(step_sampling, "rejection_sample", accept_all)
    drafted = _feature_tokens(speculative, prompt, **settings)
    assert _worst_position(plain_tokens, drafted) > 1.0


# ---- refusals ----


def test_a_draft_model_that_does_not_fit_the_target_is_refused(llama_pair, tmp_path):
    folder, _ = llama_pair
    # Another vocabulary size.
    config = TINY_MODELS["llama"]()
    config.vocab_size = 400
    other = transformers.AutoModelForCausalLM.from_config(config)
    other.save_pretrained(tmp_path / "vocab")
    make_byte_fallback_tokenizer().save_pretrained(tmp_path / "vocab")
    with pytest.raises(ConfigError, match="vocabulary of 400 tokens, the target 384"):
        LLMEngine(model=str(folder), dtype="float32", speculative_config=spec(tmp_path / "vocab"))
    # The same size, but two tokens trade ids.
    swapped = tmp_path / "tokenizer"
    save_perturbed_copy(folder, swapped, 0.0)
    tokenizer = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["<0x41>"], vocab["<0x42>"] = vocab["<0x42>"], vocab["<0x41>"]
    (swapped / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ConfigError, match="another tokenizer than the target .2 tokens differ"):
        LLMEngine(model=str(folder), dtype="float32", speculative_config=spec(swapped))
    # Shorter than max_model_len.
    config = TINY_MODELS["llama"]()
    config.max_position_embeddings = 256
    short = transformers.AutoModelForCausalLM.from_config(config)
    short.save_pretrained(tmp_path / "short")
    make_byte_fallback_tokenizer().save_pretrained(tmp_path / "short")
    with pytest.raises(ConfigError, match="reaches 256 positions, fewer than max_model_len"):
        LLMEngine(model=str(folder), dtype="float32", speculative_config=spec(tmp_path / "short"))
    # Fits once max_model_len does.
    engine = LLMEngine(
        model=str(folder),
        dtype="float32",
        max_model_len=256,
        speculative_config=spec(tmp_path / "short"),
    )
    assert engine.runner.drafter is not None


# ---- SmolLM2 with its own Q4_1 file as the draft ----

SMOLLM2_QUESTIONS = [
    "Rewrite this sentence with its spelling fixed: The wether was fine and the see was calm.",
    "List the days of the week.",
    "What is the capital of France?",
]
# A small cache with a small step budget: chunked prompts and preemption, beside
# whole steps of drafts (the tiny models show every regime apart).
SMOLLM2_SETTINGS = dict(
    block_size=8, max_num_blocks=16, max_model_len=128, max_num_batched_tokens=48
)


@pytest.mark.slow
def test_smollm2_greedy_with_its_quantized_self_as_the_draft():
    """The target dequantized to fp32, the draft the same GGUF kept in Q4_1 ("default",
    the embedded model): the tokens are the target's alone, and the draft, close to it,
    is accepted most of the time."""
    config = EngineConfig(dtype="float32", quantization="none", **SMOLLM2_SETTINGS)
    plain = LLMEngine(config)
    prompts = [
        plain.tokenizer.apply_chat_template([{"role": "user", "content": question}])
        for question in SMOLLM2_QUESTIONS * 2
    ]
    # Past eos too: every answer is as long, which the small cache cannot hold at once.
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    expected = plain.generate(prompts, params, use_tqdm=False)
    draft = {"model": "default", "num_speculative_tokens": K, "quantization": "gguf"}
    speculative = LLMEngine(config.replace(speculative_config=draft))
    got = speculative.generate(prompts, params, use_tqdm=False)
    for out, ref in zip(got, expected, strict=True):
        assert out.token_ids == ref.token_ids
    stats = speculative.metrics.spec_decode
    assert stats.acceptance_rate > 0.5, stats
    assert speculative.metrics.num_preemptions > 0
    assert speculative.memory_stats()["used_blocks"] == 0
