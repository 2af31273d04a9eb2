"""hermes: <tool_call>{...}</tool_call>, whole and streamed."""

from __future__ import annotations

import pytest
from hetero_infer.server.serving.tool_parsers import ParsedText
from hetero_infer.server.serving.tool_parsers.hermes import HermesToolParser

from tests.server.serving.tool_parsers.streaming import check_parse

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("The answer is 4.\n", "The answer is 4.\n", []),
        ("if a < b and b <tool", "if a < b and b <tool", []),
        (CALL, "", [("get_weather", '{"city": "Paris"}')]),
        ("Let me look.\n\n" + CALL, "Let me look.", [("get_weather", '{"city": "Paris"}')]),
        (
            CALL + "\n" + CALL.replace("Paris", "Rome") + "\n",
            "",
            [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')],
        ),
        # Text after a call stays content; a missing end marker is forgiven.
        ('<tool_call>{"name": "f", "arguments": {}}\nDone.', "Done.", [("f", "{}")]),
        # Braces, quotes and the end marker inside strings are the arguments' text.
        (
            '<tool_call>{"name": "f", "arguments": {"q": "a } \\" { </tool_call>"}}</tool_call>',
            "",
            [("f", '{"q": "a } \\" { </tool_call>"}')],
        ),
        # The name after the arguments, no arguments, arguments as a JSON string.
        (
            '<tool_call>{"arguments": {"x": [1, 2]}, "name": "f"}</tool_call>',
            "",
            [("f", '{"x": [1, 2]}')],
        ),
        ('<tool_call>{"name": "now"}</tool_call>', "", [("now", "{}")]),
        # Other strings before the name (an empty key too) are not the name.
        (
            '<tool_call>{"": "", "type": "function", "name": "f", "arguments": {}}</tool_call>',
            "",
            [("f", "{}")],
        ),
        (
            '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>',
            "",
            [("f", '{"x": 1}')],
        ),
        # Not a call: the marker is text. A call without a name makes no call.
        ("<tool_call>oops", "<tool_call>oops", []),
        ('<tool_call>{"arguments": {}}</tool_call>', "", []),
        ("<tool_call>{}</tool_call>", "", []),
        # Cut off by max_tokens: the arguments as far as they got.
        ('<tool_call>{"name": "f", "arguments": {"x": 1', "", [("f", '{"x": 1')]),
    ],
)
def test_parse(text: str, content: str, calls: list) -> None:
    check_parse(HermesToolParser, text, content, calls)


def test_name_goes_out_before_the_arguments_end() -> None:
    """A client sees the call as it is written: id and name first, then the
    arguments' pieces as they arrive; nothing of the marker leaks into content."""
    parser = HermesToolParser()
    out = ParsedText()
    out.add(parser.feed("Checking. <tool_"))
    assert out.content == "Checking." and not out.tool_calls
    out.add(parser.feed('call>{"name": "get_weather", "argu'))
    [header] = out.tool_calls
    assert (header.index, header.name, header.arguments) == (0, "get_weather", "")
    step = parser.feed('ments": {"city": "Pa')
    assert [(d.index, d.name, d.arguments) for d in step.tool_calls] == [(0, None, '{"city": "Pa')]
    step = parser.feed('ris"}}</tool_call>')
    assert [d.arguments for d in step.tool_calls] == ['ris"}']
    assert parser.finish() == ParsedText()
