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
