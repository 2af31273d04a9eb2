"""pythonic: [f(a=1), g()], literals only, whole and streamed."""

from __future__ import annotations

import pytest
from hetero_infer.server.serving.tool_parsers.pythonic import PythonicToolParser, parse_call

from tests.server.serving.tool_parsers.streaming import check_parse


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Hello there.", "Hello there.", []),
        ("[1, 2, 3]", "[1, 2, 3]", []),
        (
            '[get_weather(city="Paris", days=3), get_time()]',
            "",
            [("get_weather", '{"city": "Paris", "days": 3}'), ("get_time", "{}")],
        ),
        (
            "[f(a=[1, {'k': None}], b=True, s='x) ], (\\'y')]",
            "",
            [("f", '{"a": [1, {"k": null}], "b": true, "s": "x) ], (\'y"}')],
        ),
        # Not literals, or positional: no calls, the text is the answer.
        ("[f(x=g())]", "[f(x=g())]", []),
        ("[f(1)]", "[f(1)]", []),
        # A bad call after a good one ends the calls.
        ("[f(a=1), g(x=y)]", "g(x=y)]", [("f", '{"a": 1}')]),
        ("[f(a=1)] Done.", "Done.", [("f", '{"a": 1}')]),
        # Cut off: an unfinished call after a complete one is dropped.
        ('[f(a=1), g(b="', "", [("f", '{"a": 1}')]),
        ('[g(b="', '[g(b="', []),
    ],
)
def test_parse(text: str, content: str, calls: list) -> None:
    check_parse(PythonicToolParser, text, content, calls)


@pytest.mark.parametrize(
    "text", ["f(x=__import__('os'))", "f(**kw)", "f(x={1, 2})", "f(x=1e999)", "a.f(x=1)", "f("]
)
def test_parse_call_takes_literals_only(text: str) -> None:
    assert parse_call(text) is None


def test_an_answer_that_opens_no_list_streams_at_once() -> None:
    """Only text that may still open ``[name(`` is held back."""
    parser = PythonicToolParser()
    assert parser.feed("Hello").content == "Hello"
    assert parser.feed(" there.").content == " there."
    held = PythonicToolParser()
    assert held.feed("[get").content == ""
    assert held.feed("ting there]").content == "[getting there]"
