from __future__ import annotations

import pytest

from engine import SamplingParams


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
