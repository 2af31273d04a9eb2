"""chat_messages.py: which messages OpenAI's rules take (content, tool calls and ids,
images from the user only, one reasoning field), and the messages as chat templates
take them."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.chat_messages import ChatMessage, template_messages
from pydantic import ValidationError

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUFB"}}


def message(**fields: Any) -> ChatMessage:
    return ChatMessage.model_validate(fields)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"role": "user"}, "a user message needs content"),
        ({"role": "assistant"}, "an? assistant message needs content"),
        ({"role": "assistant", "tool_calls": []}, "needs content"),
        ({"role": "user", "content": "Hi", "tool_calls": [CALL]}, "only assistant messages"),
        ({"role": "user", "content": "\ud800"}, "surrogate"),
        ({"role": "tool", "content": "42"}, "needs the tool_call_id"),
        ({"role": "tool", "content": "42", "tool_call_id": ""}, "needs the tool_call_id"),
        ({"role": "assistant", "content": [IMAGE]}, "only a user message may hold images"),
        (
            {"role": "assistant", "content": "a", "reasoning_content": "r", "reasoning": "r"},
            "not both",
        ),
        ({"role": "user", "content": [{"type": "text"}]}, "needs its text as a string"),
        ({"role": "user", "content": [{"type": "audio"}]}, "'audio' are not supported"),
        (
            {"role": "user", "content": [{**IMAGE, "image_url": {"url": "u", "detail": "max"}}]},
            "detail must be one of",
        ),
        ({"role": "user", "content": [{**IMAGE, "image_url": {"url": 5}}]}, "takes a url"),
        ({"role": "user", "content": [{**IMAGE, "extra": 1}]}, "an image part is"),
    ],
)
def test_messages_refused(fields: dict[str, Any], match: str):
    with pytest.raises(ValidationError, match=match):
        message(**fields)


def test_messages_taken():
    assert message(role="assistant", tool_calls=[CALL]).content is None
    assert message(role="tool", content="42", tool_call_id="c").tool_call_id == "c"
    assert message(role="assistant", content="a", reasoning="r").reasoning == "r"
    assert message(role="assistant", content="a", reasoning_content="r").reasoning_content
    assert message(role="user", content=[{"type": "text", "text": "x"}, IMAGE])


def test_the_schema_asks_what_the_model_does_of_a_tool_message():
    schema = ChatMessage.model_json_schema()
    valid = jsonschema.Draft202012Validator(schema).is_valid
    assert valid({"role": "tool", "content": "42", "tool_call_id": "c"})
    assert not valid({"role": "tool", "content": "42", "tool_call_id": ""})
    assert not valid({"role": "tool", "content": "42"})
    assert not valid({"role": "user", "content": "Hi", "tool_calls": [CALL]})


def test_template_content():
    text = {"type": "text", "text": "look "}
    assert message(role="user", content="Hi").template_content() == "Hi"
    assert message(role="assistant", tool_calls=[CALL]).template_content() == ""
    assert message(role="user", content=[text, text]).template_content() == "look look "
    assert message(role="user", content=[text, IMAGE]).template_content() == [
        {"type": "text", "text": "look "},
        {"type": "image"},
    ]


def test_template_messages():
    messages = [
        message(role="user", content="Hi", name="ann"),
        message(role="assistant", content="", reasoning="hm", tool_calls=[CALL]),
        message(role="tool", content="42", tool_call_id="c1"),
        message(role="assistant", content="It is 42.", reasoning_content="easy"),
    ]
    assert template_messages(messages) == [
        {"role": "user", "content": "Hi", "name": "ann"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "hm",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {"role": "assistant", "content": "It is 42.", "reasoning_content": "easy"},
    ]


@pytest.mark.parametrize("arguments", ["[1]", "{bad", '"x"'])
def test_a_calls_arguments_are_a_json_object(arguments: str):
    call = {**CALL, "function": {"name": "f", "arguments": arguments}}
    messages = [message(role="user", content="Hi"), message(role="assistant", tool_calls=[call])]
    with pytest.raises(APIError, match="must be a JSON object") as error:
        template_messages(messages)
    assert error.value.param == "messages.1.tool_calls"
