"""The output of constrained tool_choices, read as calls."""

from __future__ import annotations

from hetero_infer.server.serving.tool_parsers.constrained import (
    NamedToolCallParser,
    RequiredToolCallsParser,
)

from tests.server.serving.tool_parsers.streaming import check_parse, run


def test_named() -> None:
    text = '{"city": "Paris", "days": 3}'
    check_parse(lambda: NamedToolCallParser("get_weather"), text, "", [("get_weather", text)])


def test_required() -> None:
    text = '[{"name": "a", "parameters": {"x": [1]}}, {"name": "b", "parameters": {}}]'
    check_parse(RequiredToolCallsParser, text, "", [("a", '{"x": [1]}'), ("b", "{}")])


def test_named_with_no_output_is_still_its_call() -> None:
    """Cut off before its first token (max_tokens): the call, its arguments empty."""
    assert run(NamedToolCallParser("now"), []) == ("", [("now", "")])
