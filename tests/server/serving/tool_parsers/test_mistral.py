"""mistral: [TOOL_CALLS][{...}, ...], whole and streamed."""

from __future__ import annotations

import pytest
from hetero_infer.server.serving.tool_parsers.mistral import MistralToolParser

from tests.server.serving.tool_parsers.streaming import check_parse

CALLS = '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("No tools needed [TOOL", "No tools needed [TOOL", []),
        (CALLS, "", [("f", '{"a": 1}'), ("g", "{}")]),
        ("Sure.\n" + CALLS, "Sure.", [("f", '{"a": 1}'), ("g", "{}")]),
        (CALLS + "Done.", "Done.", [("f", '{"a": 1}'), ("g", "{}")]),
        ('[TOOL_CALLS] [ {"name": "f", "arguments": {"s": "]"}} ]', "", [("f", '{"s": "]"}')]),
        ("[TOOL_CALLS]oops", "[TOOL_CALLS]oops", []),
    ],
)
def test_parse(text: str, content: str, calls: list) -> None:
    check_parse(MistralToolParser, text, content, calls)
