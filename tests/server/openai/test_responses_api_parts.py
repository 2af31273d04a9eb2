"""The parts of /v1/responses that need no engine: the output items and their events
(OutputItems), the input items and the chat messages they become, the bounded store,
the body's field checks and the renaming of the chat route's errors. The route itself
is tested end to end in test_responses_api.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.server.app import build_app
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.chat_request import ChatCompletionRequest
from hetero_infer.server.openai.responses_api import _renamed
from hetero_infer.server.openai.responses_api_items import (
    chat_messages,
    item_dicts,
    parse_items,
)
from hetero_infer.server.openai.responses_api_output import OutputItems
from hetero_infer.server.openai.responses_api_request import ResponsesRequest
from hetero_infer.server.openai.responses_api_store import ResponseStore, StoredResponse
from hetero_infer.server.openai.responses_api_stream import _encoded, respond_events
from hetero_infer.server.serving.chat_output import MessageDelta
from hetero_infer.server.serving.tool_parsers import ToolCallDelta
from hetero_infer.server.settings import ServerSettings

# ---- OutputItems ----


def feed_all(output: OutputItems, deltas: list[MessageDelta], status: str) -> list[dict]:
    events = [event for delta in deltas for event in output.feed(delta)]
    return events + output.finish(status)


def test_message_events_in_order_and_the_item_they_build():
    output = OutputItems()
    events = feed_all(
        output, [MessageDelta(content="Hel"), MessageDelta(content="lo")], "completed"
    )
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    [item] = output.items
    assert item["type"] == "message" and item["status"] == "completed"
    assert item["content"] == [
        {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}
    ]
    # The item as added is still empty and in progress; as done, whole.
    assert events[0]["item"]["status"] == "in_progress" and events[0]["item"]["content"] == []
    assert events[-1]["item"] == item
    assert {e["output_index"] for e in events} == {0}
    assert {e["item_id"] for e in events[1:-1]} == {item["id"]}
    assert events[4]["text"] == "Hello" and events[5]["part"]["text"] == "Hello"
    # One content part (index 0); a message's text deltas carry logprobs, empty.
    assert {e["content_index"] for e in events[1:-1]} == {0}
    assert events[2]["logprobs"] == events[3]["logprobs"] == []


def test_reasoning_then_text_then_calls_are_separate_items():
    output = OutputItems()
    deltas = [
        MessageDelta(reasoning="think"),
        MessageDelta(reasoning=" more", content="Answer"),
        MessageDelta(tool_calls=[ToolCallDelta(0, "x", "f", '{"a"')]),
        MessageDelta(tool_calls=[ToolCallDelta(0, arguments=": 1}")]),
        MessageDelta(tool_calls=[ToolCallDelta(1, "y", "g", "{}")]),
    ]
    events = feed_all(output, deltas, "completed")
    kinds = [item["type"] for item in output.items]
    assert kinds == ["reasoning", "message", "function_call", "function_call"]
    reasoning, message, first, second = output.items
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "think more"}]
    assert reasoning["summary"] == [] and reasoning["id"].startswith("rs_")
    assert message["content"][0]["text"] == "Answer"
    assert (first["name"], first["arguments"]) == ("f", '{"a": 1}')
    assert (second["name"], second["arguments"]) == ("g", "{}")
    assert first["call_id"].startswith("call_") and first["call_id"] != second["call_id"]
    # Each item is added, then done, before the next is added.
    lifecycle = [
        (e["type"].rsplit(".", 1)[-1], e["output_index"])
        for e in events
        if e["type"].startswith("response.output_item.")
    ]
    assert lifecycle == [(s, i) for i in range(4) for s in ("added", "done")]
    call_events = [e["type"] for e in events if e["output_index"] == 2]
    assert call_events == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == '{"a": 1}' and done["name"] == "f"
    reasoning_events = [e for e in events if e["output_index"] == 0]
    assert [e["type"] for e in reasoning_events[1:-1]] == [
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
    ]
    assert {e["content_index"] for e in reasoning_events[1:-1]} == {0}
    assert not any("logprobs" in e for e in reasoning_events)


def test_whole_answer_is_the_stream_of_one_delta():
    pieces = [MessageDelta(content="a"), MessageDelta(content="b")]
    streamed, whole = OutputItems(), OutputItems()
    feed_all(streamed, pieces, "incomplete")
    feed_all(whole, [MessageDelta(content="ab")], "incomplete")
    strip = [{k: v for k, v in item.items() if k != "id"} for item in streamed.items]
    assert strip == [{k: v for k, v in item.items() if k != "id"} for item in whole.items]
    assert whole.items[0]["status"] == "incomplete"


def test_no_output_is_an_empty_message():
    output = OutputItems()
    events = output.finish("completed")
    [item] = output.items
    assert item["type"] == "message" and item["content"][0]["text"] == ""
    assert events[0]["type"] == "response.output_item.added"
    assert events[-1]["type"] == "response.output_item.done"


# ---- input items ----


def test_items_become_chat_messages():
    items = parse_items(
        [
            {"role": "developer", "content": "Rules"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Q"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "two"}],
            },
        ]
    )
    messages = chat_messages(items)
    assert messages == [
        {"role": "developer", "content": "Rules"},
        {"role": "user", "content": "Q"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": 1}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    # What the chat route takes, and what a stored conversation keeps, round trip.
    ChatCompletionRequest.model_validate({"messages": messages})
    assert parse_items(json.loads(json.dumps(item_dicts(items)))) == items


def test_a_call_without_a_message_before_it_is_an_assistant_message():
    items = parse_items([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])
    [message] = chat_messages(items)
    assert message["role"] == "assistant" and message["content"] is None
    assert message["tool_calls"][0]["id"] == "c"


def test_a_string_is_one_user_message():
    assert chat_messages(parse_items("Hi")) == [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ([5], "input.0"),
        ([{"type": "item_reference", "id": "x"}], "input.0.type"),
        ([{"role": "user"}], "input.0.content"),
        ([{"role": "user", "content": "ok"}, {"role": "user", "content": 3}], "input.1.content"),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": "a"}, 5]}],
            "input.0.content",
        ),
        ([{"type": "function_call", "call_id": "c", "name": "f"}], "input.0.arguments"),
        ([{"type": "function_call_output", "output": "x"}], "input.0.call_id"),
        ([{"role": "user", "content": "\ud800"}], "input.0"),
    ],
)
def test_bad_items_name_their_field(raw, param):
    with pytest.raises(APIError) as info:
        parse_items(raw)
    assert info.value.status_code == 400 and info.value.param == param


# ---- the store ----


def entry(n: int) -> StoredResponse:
    return StoredResponse({"id": str(n)}, [])


def test_store_keeps_the_most_recently_used():
    store = ResponseStore(capacity=2)
    store.put("a", entry(1))
    store.put("b", entry(2))
    assert store.get("a") is not None  # a use: "b" is now the oldest
    store.put("c", entry(3))
    assert len(store) == 2 and store.get("b") is None
    assert store.get("a").body == {"id": "1"} and store.get("c").body == {"id": "3"}
    assert store.delete("a") and not store.delete("a")
    assert store.get("a") is None


# ---- the body ----


def test_unknown_and_unsupported_fields():
    with pytest.raises(APIError) as info:
        ResponsesRequest.model_validate({"input": "x", "zeta": 1})
    assert info.value.param == "zeta" and "zeta" in info.value.message
    with pytest.raises(APIError) as info:
        ResponsesRequest.model_validate({"input": "x", "truncation": "auto"})
    assert info.value.param == "truncation"
    for harmless in ({"truncation": "disabled"}, {"background": False}, {"reasoning": None}):
        ResponsesRequest.model_validate({"input": "x", **harmless})


def test_body_becomes_a_chat_request():
    body = ResponsesRequest.model_validate(
        {
            "input": "x",
            "instructions": "Be brief.",
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
            "max_output_tokens": 5,
            "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
            "parallel_tool_calls": False,
        }
    )
    chat = body.chat_request(chat_messages(parse_items(body.input)))
    assert [m.role for m in chat.messages] == ["system", "user"]
    assert chat.tools[0].function.name == "f"
    assert chat.tool_choice.function.name == "f"
    assert chat.max_completion_tokens == 5 and chat.parallel_tool_calls is False
    assert chat.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "s", "schema": {"type": "object"}},
    }


def test_chat_errors_get_the_responses_names():
    cases = {
        "messages": "input",
        "messages.2.content": "input",
        "response_format": "text.format",
        "max_tokens": "max_output_tokens",
        "tools.1.function.strict": "tools.1.strict",
        "tool_choice": "tool_choice",
    }
    for chat_param, param in cases.items():
        error = _renamed(APIError(400, "response_format is bad", param=chat_param, code="x"))
        assert error.param == param and error.code == "x"
        assert error.message == "text.format is bad"


# ---- the SSE transport ----


async def _events(fail_after: int):
    for index in range(fail_after):
        yield {"type": f"response.test.{index}"}
    raise APIError(503, "the engine has failed", "service_unavailable")


def _parsed(raw: list[bytes]) -> list[tuple[str, dict]]:
    out = []
    for event in raw:
        name, data = event.decode().strip().split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


async def _collect(events) -> list[bytes]:
    return [event async for event in events]


def test_an_error_after_the_status_line_is_the_last_event():
    raw = asyncio.run(_collect(_encoded(_events(fail_after=2))))
    events = _parsed(raw)
    assert [name for name, _ in events] == ["response.test.0", "response.test.1", "error"]
    assert [data["sequence_number"] for _, data in events] == [0, 1, 2]
    assert events[-1][1] == {
        "type": "error",
        "sequence_number": 2,
        "code": "service_unavailable",
        "message": "the engine has failed",
        "param": None,
    }


class _RefusedAnswer:
    """An answer refused before its first event (as a full queue refuses one)."""

    class ctx:  # noqa: N801 - the attribute respond_events reads
        @staticmethod
        async def until_disconnect(work):
            return await work

    def chunks(self):
        return _events(fail_after=0)


def test_an_error_before_the_first_event_is_its_status():
    response = asyncio.run(respond_events(_RefusedAnswer(), stream=True))
    assert response.status_code == 503
    assert json.loads(response.body)["error"]["code"] == "service_unavailable"


# ---- the OpenAPI schema ----


def test_the_routes_document_their_bodies_and_answers():
    schema = build_app(ServerSettings(engine=EngineConfig())).openapi()
    post = schema["paths"]["/v1/responses"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body == "#/components/schemas/ResponsesRequest"
    ok = post["responses"]["200"]["content"]
    assert ok["application/json"]["schema"]["$ref"] == "#/components/schemas/ResponseObject"
    assert "text/event-stream" in ok
    assert "4XX" in post["responses"] and "422" not in post["responses"]
    stored = schema["paths"]["/v1/responses/{response_id}"]
    assert {"get", "delete"} <= set(stored)
    bodies = schema["components"]["schemas"]
    kinds = [
        branch["items"]
        for branch in bodies["ResponsesRequest"]["properties"]["input"]["anyOf"]
        if branch.get("type") == "array"
    ]
    assert len(kinds) == 1 and len(kinds[0]["anyOf"]) == 4  # the four item types
