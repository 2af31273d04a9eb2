from __future__ import annotations

import pytest
from hetero_infer.engine import SamplingParams
from hetero_infer.engine.params.guided_decoding import StructuredOutputsParams
from hetero_infer.engine.params.sampling_params import (
    MAX_BAD_WORDS,
    MAX_LOGPROBS,
    MAX_N,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOKEN_ID_ENTRIES,
    RequestOutputKind,
)

MANY_IDS = list(range(MAX_TOKEN_ID_ENTRIES + 1))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("max_tokens", 2.0),
        ("temperature", -1),
        ("temperature", float("nan")),
        ("top_p", 0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("min_p", 2),
        ("seed", -1),
        ("seed", 2**64),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("repetition_penalty", 0),
        ("min_tokens", -1),
        ("min_tokens", 17),  # more than max_tokens
        ("stop", [1]),
        ("stop", ["x"] * 17),
        ("stop", ["x" * 257]),
        ("stop_token_ids", [-1]),
        ("logit_bias", {1: 101}),
        ("logit_bias", {-1: 1}),
        ("logit_bias", dict.fromkeys(MANY_IDS, 1.0)),
        ("n", 0),
        ("n", MAX_N + 1),
        ("n", 2.0),
        ("top_k", 1.5),
        ("top_k", True),
        ("seed", 2**63),
        ("seed", "1"),
        ("seed", True),
        ("logprobs", -1),
        ("logprobs", MAX_LOGPROBS + 1),
        ("prompt_logprobs", MAX_LOGPROBS + 1),
        ("repetition_penalty", 100.5),
        ("stop_token_ids", MANY_IDS),
        ("json_schema", "{}"),
        ("structured_outputs", {"json": {}}),
        ("cache_salt", ""),
        ("allowed_token_ids", []),
        ("allowed_token_ids", [-1]),
        ("allowed_token_ids", [5, -1]),
        ("bad_words", [""]),
        ("bad_words", ["x"] * (MAX_BAD_WORDS + 1)),
        ("bad_words", ["x" * (MAX_STOP_STRING_CHARS + 1)]),
    ],
)
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_values_at_the_edges_are_accepted():
    SamplingParams(
        n=MAX_N, top_k=-1, seed=2**63 - 1, logprobs=MAX_LOGPROBS, prompt_logprobs=0,
        repetition_penalty=100, presence_penalty=-2, frequency_penalty=2,
        min_tokens=16, max_tokens=16, logit_bias={0: -100, 1: 100}, cache_salt="s",
        stop=["x" * MAX_STOP_STRING_CHARS] * MAX_STOP_STRINGS, stop_token_ids=MANY_IDS[:-1],
        allowed_token_ids=[0], bad_words=["x" * MAX_STOP_STRING_CHARS] * MAX_BAD_WORDS,
    )  # fmt: skip
    SamplingParams(logit_bias=dict.fromkeys(MANY_IDS[:-1], 0.0))


def test_one_constraint_at_a_time():
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(json_schema={}, structured_outputs=StructuredOutputsParams(regex="a"))


def test_defaults_and_greedy():
    params = SamplingParams()
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (16, 1.0, 1.0, -1)
    # vLLM's: one choice, no min_p, special tokens left out, every output cumulative.
    assert (params.n, params.min_p, params.skip_special_tokens) == (1, 0.0, True)
    assert params.output_kind == RequestOutputKind.CUMULATIVE and params.min_tokens == 0
    assert SamplingParams(temperature=0).greedy and not params.greedy
    assert SamplingParams(top_k=0).top_k == -1


def test_stop_forms_and_vocab_check():
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(stop=["", "y"]).stop == ["y"]
    params = SamplingParams(logit_bias={5: 1.0}, stop_token_ids=[3])
    params.check_vocab(10)
    with pytest.raises(ValueError, match="logit_bias"):
        params.check_vocab(5)
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[7]).check_vocab(5)
