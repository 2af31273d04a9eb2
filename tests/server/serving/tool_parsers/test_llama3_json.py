"""llama3_json: {"name": ..., "parameters": {...}} calls, whole and streamed."""

from __future__ import annotations

import pytest
from hetero_infer.server.serving.tool_parsers.llama3_json import Llama3JsonToolParser

from tests.server.serving.tool_parsers.streaming import check_parse


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Paris is the capital.", "Paris is the capital.", []),
        # JSON that is not a call is an answer.
        ('{"answer": 42}', '{"answer": 42}', []),
        ('{"name": "f", "parameters": {"a": 1}}', "", [("f", '{"a": 1}')]),
        ('<|python_tag|>{"name": "f", "parameters": {}}', "", [("f", "{}")]),
        (
            ' {"name": "f", "parameters": {"a": 1}}; {"name": "g", "arguments": {"b": "x;y"}}',
            "",
            [("f", '{"a": 1}'), ("g", '{"b": "x;y"}')],
        ),
        ('{ "name": "f", "parameters": {} }\nThat is all.', "That is all.", [("f", "{}")]),
        ("{", "{", []),
    ],
)
def test_parse(text: str, content: str, calls: list) -> None:
    check_parse(Llama3JsonToolParser, text, content, calls)


def test_an_answer_that_opens_no_call_streams_at_once() -> None:
    """Only text that may still be <|python_tag|> or open a call is held back."""
    assert Llama3JsonToolParser().feed("Hi").content == "Hi"
    held = Llama3JsonToolParser()
    assert held.feed("<|py").content == ""
    assert held.feed("ramid").content == "<|pyramid"
