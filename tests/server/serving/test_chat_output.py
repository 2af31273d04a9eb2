"""ChatOutputParser: reasoning, then tool calls in the content after it; and the
shapes of tool calls in whole bodies and stream chunks."""

from __future__ import annotations

from hetero_infer.server.serving.chat_output import (
    ChatOutputParser,
    MessageDelta,
    tool_calls_body,
    tool_calls_delta,
)
from hetero_infer.server.serving.reasoning import reasoning_parser
from hetero_infer.server.serving.tool_parsers import ToolCallDelta
from hetero_infer.server.serving.tool_parsers.hermes import HermesToolParser

TEXT = (
    "<think>Weather needs the tool.</think>\n\n"
    '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>\n'
    '<tool_call>{"name": "time", "arguments": {}}</tool_call>'
)


def test_reasoning_then_calls() -> None:
    parser = ChatOutputParser(reasoning_parser("qwen3"), HermesToolParser())
    message = parser.parse(TEXT)
    assert message.reasoning == "Weather needs the tool."
    assert message.content == ""
    calls = tool_calls_body(message.tool_calls)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("weather", '{"city": "Paris"}'),
        ("time", "{}"),
    ]
    assert all(c["type"] == "function" and c["id"].startswith("chatcmpl-tool-") for c in calls)
    assert parser.made_calls


def test_streamed_the_same() -> None:
    parser = ChatOutputParser(reasoning_parser("qwen3"), HermesToolParser())
    streamed = MessageDelta()
    for char in TEXT:
        streamed.add(parser.feed(char))
    streamed.add(parser.finish())
    whole = ChatOutputParser(reasoning_parser("qwen3"), HermesToolParser()).parse(TEXT)
    assert (streamed.reasoning, streamed.content) == (whole.reasoning, whole.content)
    assert names_and_arguments(streamed) == names_and_arguments(whole)
    assert len(streamed.tool_calls) > len(whole.tool_calls)  # it came in pieces


def test_calls_streamed_without_a_reasoning_parser() -> None:
    text = TEXT[TEXT.index("<tool_call>") :]
    parser = ChatOutputParser(tools=HermesToolParser())
    streamed = MessageDelta()
    for char in text:
        streamed.add(parser.feed(char))
    streamed.add(parser.finish())
    assert names_and_arguments(streamed) == [("weather", '{"city": "Paris"}'), ("time", "{}")]
    assert streamed.content.strip() == ""
    # A marker's start held back while it might open a call is content at the end.
    parser = ChatOutputParser(tools=HermesToolParser())
    first = parser.feed("Done <tool_c").content
    assert "<" not in first and first + parser.finish().content == "Done <tool_c"


def names_and_arguments(message: MessageDelta) -> list[tuple[str, str]]:
    calls = tool_calls_body(message.tool_calls)
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def test_no_parallel_calls_keeps_the_first() -> None:
    message = ChatOutputParser(reasoning_parser("qwen3"), HermesToolParser(), max_calls=1).parse(
        TEXT
    )
    assert [c["function"]["name"] for c in tool_calls_body(message.tool_calls)] == ["weather"]


def test_no_tool_parser_is_plain_text() -> None:
    parser = ChatOutputParser()
    message = parser.parse("<tool_call>{}</tool_call>")
    assert message == MessageDelta(content="<tool_call>{}</tool_call>")
    assert not parser.made_calls


def test_made_calls_only_after_a_call() -> None:
    parser = ChatOutputParser(tools=HermesToolParser())
    parser.parse("No tool needed.")
    assert not parser.made_calls


def test_a_delta_is_empty_only_with_nothing_in_it() -> None:
    assert not MessageDelta()
    assert MessageDelta(reasoning="a") and MessageDelta(content="a")
    assert MessageDelta(tool_calls=[ToolCallDelta(0, arguments="{")])


def test_delta_shape() -> None:
    """A chunk's entries: one per call, its first carrying id, type and name."""
    deltas = [
        ToolCallDelta(0, "chatcmpl-tool-a", "f", '{"x'),
        ToolCallDelta(0, arguments='": 1}'),
        ToolCallDelta(1, "chatcmpl-tool-b", "g", ""),
    ]
    assert tool_calls_delta(deltas) == [
        {
            "index": 0,
            "id": "chatcmpl-tool-a",
            "type": "function",
            "function": {"name": "f", "arguments": '{"x": 1}'},
        },
        {
            "index": 1,
            "id": "chatcmpl-tool-b",
            "type": "function",
            "function": {"name": "g", "arguments": ""},
        },
    ]
    assert tool_calls_delta([ToolCallDelta(1, arguments="}")]) == [
        {"index": 1, "function": {"arguments": "}"}}
    ]
