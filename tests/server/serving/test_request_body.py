"""server/serving/request_body.py: the name an unknown field's 400 echoes, and how deep
a body may nest."""

from __future__ import annotations

import pytest
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.completion_request import CompletionRequest
from hetero_infer.server.serving.request_body import check_depth


@pytest.mark.parametrize(("length", "shown"), [(64, "f" * 64), (65, "f" * 64 + "...")])
def test_an_unknown_field_is_named_up_to_64_characters(length: int, shown: str):
    with pytest.raises(APIError) as info:
        CompletionRequest.model_validate({"prompt": "x", "f" * length: 1})
    assert info.value.param == shown
    assert info.value.message == f"Unrecognized request argument supplied: {shown}"


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("container", [list, dict])
def test_depth_limit(container):
    def wrap(depth: int):
        value = nested(depth)
        return {"k": value} if container is dict else [value]

    check_depth(wrap(3), 4)  # four levels: the limit
    with pytest.raises(ValueError, match="more than 4 levels"):
        check_depth(wrap(4), 4)
    check_depth(5, 1)  # a scalar has no depth
