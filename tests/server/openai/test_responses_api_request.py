"""responses_api_request.py: a /v1/responses body's fields at their bounds, its
defaults, the forms tool_choice and text.format take, and metadata's limits (OpenAI's:
16 pairs, keys of 64 characters, values of 512)."""

from __future__ import annotations

from typing import Any

import pytest
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.responses_api_request import (
    MAX_METADATA_KEY,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE,
    ResponsesRequest,
    TextConfig,
)
from pydantic import ValidationError


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"input": "Hi", **fields})


def test_defaults_are_openais():
    body = request()
    assert body.stream is False and body.store is True
    assert body.tool_choice is None and body.metadata is None


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("max_output_tokens", 1, True),
        ("max_output_tokens", 0, False),
        ("temperature", 0, True),
        ("temperature", 2, True),
        ("temperature", -0.01, False),
        ("temperature", 2.01, False),
        ("top_p", 0.01, True),
        ("top_p", 1, True),
        ("top_p", 0, False),
        ("top_p", 1.01, False),
        ("tool_choice", "none", True),
        ("tool_choice", "auto", True),
        ("tool_choice", "required", True),
        ("tool_choice", {"type": "function", "name": "f"}, True),
        ("tool_choice", "sometimes", False),
        ("instructions", "Be brief.", True),
        ("instructions", "\ud800", False),
        ("top_logprobs", 0, True),
        ("top_logprobs", 1, False),
    ],
)
def test_fields_at_their_bounds(field: str, value: Any, valid: bool):
    if valid:
        request(**{field: value})
    else:
        with pytest.raises((ValidationError, APIError)):
            request(**{field: value})


def test_a_bad_tool_choice_is_one_message():
    """Not one error per member of the union."""
    with pytest.raises(ValidationError, match='must be "none", "auto", "required" or') as error:
        request(tool_choice="sometimes")
    assert error.value.error_count() == 1


def metadata(pairs: int = 1, key: int = 1, value: int = 1) -> dict[str, str]:
    return {f"{i:0{key}d}": "v" * value for i in range(pairs)}


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (metadata(pairs=MAX_METADATA_PAIRS), True),
        (metadata(pairs=MAX_METADATA_PAIRS + 1), False),
        (metadata(key=MAX_METADATA_KEY), True),
        (metadata(key=MAX_METADATA_KEY + 1), False),
        (metadata(value=MAX_METADATA_VALUE), True),
        (metadata(value=MAX_METADATA_VALUE + 1), False),
        ({"k": "\ud800"}, False),
    ],
)
def test_metadata_limits(value: dict[str, str], valid: bool):
    if valid:
        assert request(metadata=value).metadata == value
    else:
        with pytest.raises(ValidationError):
            request(metadata=value)


def test_text_format_as_the_chat_routes_response_format():
    for fmt in (None, {"type": "text"}, {"type": "json_object"}):
        assert TextConfig(format=fmt).response_format() == fmt
    schema = {"type": "object"}
    named = TextConfig(format={"type": "json_schema", "name": "answer", "schema": schema})
    assert named.response_format() == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema},
    }
    unnamed = TextConfig(format={"type": "json_schema", "schema": schema}).response_format()
    assert unnamed["json_schema"]["name"] == "response"
    for bad in ({"type": "json_schema"}, {"type": "xml"}):
        with pytest.raises(APIError) as error:
            TextConfig(format=bad).response_format()
        assert error.value.param == "text.format"
