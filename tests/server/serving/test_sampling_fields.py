"""SamplingFields on their own, no server: each field's range at both ends, the fields
that are refused by name, and the SamplingParams (or beam search params) a body maps to.
The server tests send the same fields over HTTP; these pin each value of the mapping."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hetero_infer.engine.params.sampling_params import (
    MAX_LOGPROBS,
    MAX_N,
    RequestOutputKind,
    SamplingParams,
)
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.completion_request import CompletionRequest
from pydantic import ValidationError

# The sampler makes int64 tensors and generators of seeds and top_k.
INT64_MAX = 2**63 - 1
BEAM = {"use_beam_search": True, "n": 3}


def body(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "Hi", **fields})


def refused(call: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        call()
    assert caught.value.status_code == 400
    return caught.value


# (field, values accepted at the ends of its range, values just past them)
RANGES = [
    ("temperature", [0, 2], [-0.01, 2.01]),
    ("top_p", [1e-9, 1], [0, 1.01]),
    ("top_k", [-1, INT64_MAX], [-2, INT64_MAX + 1]),
    ("min_p", [0, 1], [-0.01, 1.01]),
    ("seed", [0, INT64_MAX], [-1, INT64_MAX + 1]),
    ("min_tokens", [0], [-1]),
    ("presence_penalty", [-2, 2], [-2.01, 2.01]),
    ("frequency_penalty", [-2, 2], [-2.01, 2.01]),
    ("repetition_penalty", [1e-9, 100], [0, 100.01]),
    ("n", [1, MAX_N], [0, MAX_N + 1]),
    ("timeout", [1e-9], [0, math.inf, math.nan]),
    ("prompt_logprobs", [0, MAX_LOGPROBS], [-1, MAX_LOGPROBS + 1]),
    ("request_id", ["a", "a" * 256], ["", "a" * 257]),
    ("truncate_prompt_tokens", [-1], [-2]),
    ("cache_salt", ["s"], [""]),
    ("allowed_token_ids", [[0]], [[]]),
    ("thinking_token_budget", [0], [-1]),
    ("length_penalty", [-2.5], [math.inf]),
    ("early_stopping", [True, False, "never"], ["always", 1, 0]),
]


@pytest.mark.parametrize(("name", "accepted", "past"), RANGES, ids=[r[0] for r in RANGES])
def test_each_field_takes_its_range_and_nothing_past_it(name, accepted, past):
    for value in accepted:
        assert getattr(body(**{name: value}), name) == value
    for value in past:
        with pytest.raises(ValidationError) as caught:
            body(**{name: value})
        assert [error["loc"][0] for error in caught.value.errors()] == [name], value


def test_usage_options():
    assert not body().include_usage and not body().continuous_usage
    alone = body(stream=True, stream_options={"continuous_usage_stats": True})
    assert not alone.include_usage and not alone.continuous_usage
    usage = body(stream=True, stream_options={"include_usage": True})
    assert usage.include_usage and not usage.continuous_usage
    both = {"include_usage": True, "continuous_usage_stats": True}
    assert body(stream=True, stream_options=both).continuous_usage


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"best_of": 2}, "best_of"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"length_penalty": 2.0}, "length_penalty"),
        ({"early_stopping": True}, "early_stopping"),
        ({"early_stopping": "never"}, "early_stopping"),
    ],
)
def test_beam_search_fields_without_the_search_are_refused(fields, param):
    assert refused(lambda: body(**fields).sampling_params(8)).param == param


def test_best_of_1_is_accepted():
    assert body(best_of=1).sampling_params(8).n == 1
    assert body(**BEAM, best_of=1).beam_search_params(8)[1].beam_width == 3


def test_fields_map_onto_sampling_params():
    fields = {
        "temperature": 0.5, "top_p": 0.75, "top_k": 7, "min_p": 0.25, "seed": 11,
        "stop": ["x"], "stop_token_ids": [3], "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "repetition_penalty": 1.5, "cache_salt": "s",
        "allowed_token_ids": [4, 5], "bad_words": ["no"], "n": 3, "ignore_eos": True,
        "include_stop_str_in_output": True, "min_tokens": 2, "skip_special_tokens": False,
        "spaces_between_special_tokens": False, "logit_bias": {"5": 1.5, "6": -100},
    }  # fmt: skip
    params = body(**fields).sampling_params(9)
    expected = {**fields, "max_tokens": 9, "logit_bias": {5: 1.5, 6: -100}}
    assert {name: getattr(params, name) for name in expected} == expected
    assert params.output_kind == RequestOutputKind.FINAL_ONLY
    assert body(stream=True).sampling_params(9).output_kind == RequestOutputKind.DELTA


def test_a_body_of_no_fields_is_the_default_params():
    expected = SamplingParams(max_tokens=4, output_kind=RequestOutputKind.FINAL_ONLY)
    assert body().sampling_params(4) == expected


def test_defaults_fill_only_what_the_body_leaves_out():
    defaults = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}
    params = body(temperature=0.2, top_k=-1).sampling_params(4, defaults)
    assert (params.temperature, params.top_p, params.top_k) == (0.2, 0.9, -1)
    assert params.repetition_penalty == 1.1
    # The body's own fields are never a default's: n and max_tokens are the body's.
    assert body().sampling_params(4, {"n": 2, "max_tokens": 1}).n == 1


@pytest.mark.parametrize(
    ("key", "shown"),
    [("abc", "'abc'"), ("9x" * 16, repr("9x" * 16)), ("9x" * 40, repr("9x" * 16 + "..."))],
    ids=["short", "32 characters", "long"],
)
def test_a_logit_bias_key_that_is_no_token_id_is_named(key, shown):
    error = refused(lambda: body(logit_bias={key: 1}).sampling_params(4))
    assert error.param == "logit_bias"
    assert f"key {shown} is not a token id" in error.message


def test_an_empty_logit_bias_biases_nothing():
    assert body(logit_bias={}).sampling_params(4).logit_bias == {}


@pytest.mark.parametrize(
    ("fields", "logprobs", "prompt_logprobs"),
    [
        ({"logprobs": 3}, 3, None),
        ({"logprobs": 3, "echo": True}, 3, 3),
        ({"logprobs": 3, "echo": True, "prompt_logprobs": 3}, 3, 3),
        ({"logprobs": 3, "prompt_logprobs": 0}, 3, 0),
        ({"prompt_logprobs": 2}, None, 2),
    ],
)
def test_logprobs_and_prompt_logprobs(fields, logprobs, prompt_logprobs):
    params = body(**fields).sampling_params(4)
    assert (params.logprobs, params.prompt_logprobs) == (logprobs, prompt_logprobs)


def test_echo_with_other_prompt_logprobs_is_refused():
    fields = {"logprobs": 3, "echo": True, "prompt_logprobs": 2}
    assert refused(lambda: body(**fields).sampling_params(4)).param == "prompt_logprobs"


def test_constraints_reach_the_params():
    params = body(response_format={"type": "json_object"}).sampling_params(4)
    assert (params.json_schema, params.structured_outputs) == ({"type": "object"}, None)
    params = body(guided_regex="[ab]+").sampling_params(4)
    assert params.json_schema is None and params.structured_outputs.regex == "[ab]+"
    assert body(guided_regex="a").constraint_param() == "guided_regex"
    assert body().constraint_param() == "response_format"


def test_answer_id_is_made_of_the_request_id():
    assert body(request_id="abc").answer_id("cmpl-7", "cmpl") == "cmpl-abc"
    assert body().answer_id("cmpl-7", "cmpl") == "cmpl-7"


def test_beam_search_params():
    fields = {
        **BEAM, "length_penalty": 0.5, "early_stopping": "never", "ignore_eos": True,
        "stop_token_ids": [2, 9], "include_stop_str_in_output": True,
        "skip_special_tokens": False, "spaces_between_special_tokens": False, "stream": True,
    }  # fmt: skip
    described, search = body(**fields).beam_search_params(12)
    assert (search.beam_width, search.max_tokens, search.length_penalty) == (3, 12, 0.5)
    assert (search.early_stopping, search.ignore_eos) == ("never", True)
    assert search.stop_token_ids == (2, 9)
    assert search.include_stop_str_in_output and not search.skip_special_tokens
    assert not search.spaces_between_special_tokens
    assert (described.n, described.max_tokens, described.temperature) == (3, 12, 0.0)
    assert described.stop_token_ids == [2, 9]
    assert described.output_kind == RequestOutputKind.DELTA
    described, _ = body(**BEAM).beam_search_params(12)
    assert described.output_kind == RequestOutputKind.FINAL_ONLY


NEUTRAL = {
    "temperature": [0, 0.0], "top_p": [1, 1.0], "top_k": [-1, 0], "min_p": [0],
    "presence_penalty": [0], "frequency_penalty": [0], "repetition_penalty": [1],
    "min_tokens": [0], "logit_bias": [{}], "stop": [[], ""],
}  # fmt: skip
NOT_NEUTRAL = {
    "temperature": 0.5, "top_p": 0.5, "top_k": 1, "min_p": 0.5, "presence_penalty": 1,
    "frequency_penalty": 1, "repetition_penalty": 2, "min_tokens": 1,
    "logit_bias": {"1": 1}, "stop": "x", "logprobs": 0, "response_format":
    {"type": "json_object"}, "guided_choice": ["a"], "best_of": 2,
}  # fmt: skip


@pytest.mark.parametrize(("name", "values"), NEUTRAL.items())
def test_beam_search_takes_neutral_sampling_values(name, values):
    for value in values:
        body(**BEAM, **{name: value}).beam_search_params(4)


@pytest.mark.parametrize(("name", "value"), NOT_NEUTRAL.items())
def test_beam_search_refuses_what_it_cannot_honour(name, value):
    error = refused(lambda: body(**BEAM, **{name: value}).beam_search_params(4))
    assert error.param == name
