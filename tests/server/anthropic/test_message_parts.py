"""The pure parts of /v1/messages, without an engine: a body's translation into chat
messages, parsed pieces into content block events, the stop reason, a call's input."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hetero_infer.server.anthropic.chat_translation import chat_messages, chat_plan
from hetero_infer.server.anthropic.messages import ending, tool_input
from hetero_infer.server.anthropic.messages_request import MessagesRequest
from hetero_infer.server.anthropic.messages_stream import BlockEvents
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.chat_output import MessageDelta
from hetero_infer.server.serving.tool_parsers import ToolCallDelta
from pydantic import ValidationError

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def body(**fields) -> MessagesRequest:
    values = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    return MessagesRequest.model_validate(values | fields)


def test_conversation_as_chat_messages():
    request = body(
        system=[{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}],
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Rome"}},
                    {"type": "tool_use", "id": "t2", "name": "w", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [
                            {"type": "text", "text": "no "},
                            {"type": "text", "text": "city"},
                        ],
                        "is_error": True,
                    },
                ],
            },
        ],
    )
    assert chat_messages(request) == [
        {"role": "system", "content": "One.\nTwo."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "w", "arguments": '{"city": "Rome"}'},
                },
                {"id": "t2", "type": "function", "function": {"name": "w", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "Sunny", "name": "w"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: no city", "name": "w"},
    ]


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("max_tokens", 1, True),
        ("max_tokens", 0, False),
        ("temperature", 0, True),
        ("temperature", 1, True),
        ("temperature", 1.01, False),
        ("temperature", -0.01, False),
        ("top_p", 0.01, True),
        ("top_p", 1, True),
        ("top_p", 0, False),
        ("top_p", 1.01, False),
        ("top_k", 0, True),
        ("top_k", -1, False),
        ("top_k", 2**63 - 1, True),
        ("top_k", 2**63, False),
    ],
)
def test_sampling_fields_at_their_bounds(field, value, valid):
    """Anthropic's ranges: temperature and top_p within [0, 1], top_k from 0 (every
    token) to what the engine's int64 holds."""
    if valid:
        assert getattr(body(**{field: value}), field) == value
    else:
        with pytest.raises(ValidationError):
            body(**{field: value})


def test_a_model_and_a_message_are_needed():
    for fields in ({"model": ""}, {"messages": []}):
        with pytest.raises(ValidationError):
            body(**fields)


@pytest.mark.parametrize(
    ("role", "block"),
    [
        ("assistant", {"type": "tool_use", "id": "", "name": "f", "input": {}}),
        ("assistant", {"type": "tool_use", "id": "t", "name": "", "input": {}}),
        ("user", {"type": "tool_result", "tool_use_id": ""}),
        ("user", {"type": "image", "source": {"type": "url", "url": ""}}),
        (
            "user",
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}},
        ),
    ],
)
def test_ids_names_and_image_sources_are_not_empty(role, block):
    def messages(block: dict) -> list[dict]:
        if role == "user":
            return [{"role": "user", "content": [block]}]
        return [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [block]},
            {"role": "user", "content": "Go on"},
        ]

    with pytest.raises(ValidationError):
        body(messages=messages(block))
    one_character = json.loads(json.dumps(block).replace('""', '"x"'))
    assert body(messages=messages(one_character))


def test_a_user_turn_of_tool_results_and_text():
    """Results become tool messages; the turn's text, if any, a user message after them."""
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"}
    text = {"type": "text", "text": "Thanks."}
    tool = {"role": "tool", "tool_call_id": "t1", "content": "Sunny"}
    turns = [
        ([result], [tool]),
        ([result, text], [tool, {"role": "user", "content": "Thanks."}]),
        ([], [{"role": "user", "content": ""}]),
    ]
    for content, expected in turns:
        assert chat_messages(body(messages=[{"role": "user", "content": content}])) == expected


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "none"}, "none", None),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "tool", "name": "w"}, {"type": "function", "function": {"name": "w"}}, None),
    ],
)
def test_tools_and_sampling_as_the_chat_plan(choice, expected, parallel):
    tools = [{"name": "w", "description": "Weather", "input_schema": SCHEMA}]
    chat = chat_plan(
        body(tools=tools, tool_choice=choice, stop_sequences=["END"], temperature=0.5, top_k=3)
    )
    assert chat.tools[0].function.model_dump(exclude_none=True) == {
        "name": "w",
        "description": "Weather",
        "parameters": SCHEMA,
    }
    tool_choice = chat.tool_choice
    assert (
        tool_choice.model_dump() if hasattr(tool_choice, "model_dump") else tool_choice
    ) == expected
    assert chat.parallel_tool_calls is parallel
    assert (chat.stop, chat.temperature, chat.top_k, chat.max_tokens) == (["END"], 0.5, 3, 4)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
        [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}],
    ],
)
def test_conversations_refused(messages):
    with pytest.raises(ValidationError):
        body(messages=messages)


def test_block_events_open_and_close_blocks_in_order():
    events = BlockEvents()
    pieces = [
        MessageDelta(reasoning="Let me "),
        MessageDelta(reasoning="see.", content="Calling"),
        MessageDelta(content=" w.", tool_calls=[ToolCallDelta(0, "x", "w", '{"city"')]),
        MessageDelta(tool_calls=[ToolCallDelta(0, arguments=': "Rome"}')]),
        MessageDelta(tool_calls=[ToolCallDelta(1, "y", "w", "")]),
        MessageDelta(tool_calls=[ToolCallDelta(1, arguments="{}")]),
    ]
    out = [event for piece in pieces for event in events.add(piece)]
    out += list(events.close())
    shown = [
        (name, data.get("index"), data.get("delta") or data.get("content_block"))
        for name, data in out
    ]
    starts = [data["content_block"] for name, data in out if name == "content_block_start"]
    tool_ids = [block["id"] for block in starts if block["type"] == "tool_use"]
    assert all(i.startswith("toolu_") for i in tool_ids) and len(set(tool_ids)) == 2
    assert shown == [
        ("content_block_start", 0, {"type": "thinking", "thinking": "", "signature": ""}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": "Let me "}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": "see."}),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, {"type": "text", "text": ""}),
        ("content_block_delta", 1, {"type": "text_delta", "text": "Calling"}),
        ("content_block_delta", 1, {"type": "text_delta", "text": " w."}),
        ("content_block_stop", 1, None),
        (
            "content_block_start",
            2,
            {"type": "tool_use", "id": tool_ids[0], "name": "w", "input": {}},
        ),
        ("content_block_delta", 2, {"type": "input_json_delta", "partial_json": '{"city"'}),
        ("content_block_delta", 2, {"type": "input_json_delta", "partial_json": ': "Rome"}'}),
        ("content_block_stop", 2, None),
        (
            "content_block_start",
            3,
            {"type": "tool_use", "id": tool_ids[1], "name": "w", "input": {}},
        ),
        ("content_block_delta", 3, {"type": "input_json_delta", "partial_json": "{}"}),
        ("content_block_stop", 3, None),
    ]


def output(finish_reason: str, stop_reason: str | int | None = None):
    return SimpleNamespace(finish_reason=finish_reason, stop_reason=stop_reason)


def test_stop_reasons():
    assert ending(output("stop"), made_calls=False) == ("end_turn", None)
    assert ending(output("stop"), made_calls=True) == ("tool_use", None)
    assert ending(output("stop", "END"), made_calls=False) == ("stop_sequence", "END")
    assert ending(output("stop", 7), made_calls=False) == ("end_turn", None)
    assert ending(output("length"), made_calls=True) == ("max_tokens", None)
    assert ending(output("abort"), made_calls=False) == ("max_tokens", None)
    with pytest.raises(APIError) as info:
        ending(output("error"), made_calls=False)
    assert info.value.status_code == 400  # the request's constraint could not be followed


def test_tool_input():
    assert tool_input('{"city": "Rome"}') == {"city": "Rome"}
    assert tool_input('{"city": "Ro') == {"city": "Ro"}  # cut short by max_tokens
    assert tool_input("") == {} and tool_input("[1]") == {} and tool_input("}{") == {}
