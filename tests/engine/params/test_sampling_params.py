from __future__ import annotations

import pytest
from hetero_infer.engine import SamplingParams


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
    ],
)
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_defaults_and_greedy():
    params = SamplingParams()
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (16, 1.0, 1.0, -1)
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
