"""Constraints that pass their first tokens and fail later, in the middle of the output:
the output must first make a choice (a digit, a letter), and only then does the grammar
meet more alternatives at one point than llguidance takes (2,000) or get forced into
an output without end. Building the grammar steps it over its first tokens only
(test_abuse_constraints.py has those it refuses), so these run, and each route must
say that the generation failed:

- OpenAI's completions and chat: ``finish_reason: "error"``;
- the Responses API: ``status: "failed"`` with an ``error`` (code, message, param),
  whole and as the stream's ``response.failed``;
- Anthropic's messages: a 400 ``invalid_request_error`` whole, an ``error`` event in a
  stream that had begun;
- Ollama's: ``done_reason: "error"``.

Never a 500, never "completed"; the route serves afterwards, no KV block held.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import LiveServer
from tests.server.route_shapes import check_anthropic_error, parse_anthropic_stream, sse_events
from tests.server.test_abuse_routes import (
    CHAT,
    COMPLETIONS,
    MESSAGES,
    OLLAMA_CHAT,
    OLLAMA_GENERATE,
    RESPONSES,
    chat,
    check_still_serving,
    completions,
    messages,
    ollama_chat,
    ollama_generate,
    responses,
    send,
)

ROOM = 48  # tokens: well past where each constraint fails


def object_of(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


LOOP = {"$ref": "#/$defs/loop"}
# A digit to choose, then "a" forced to hold an "a" forever.
LATE_LOOP = {**object_of(k={"enum": [0, 1]}, a=LOOP), "$defs": {"loop": object_of(a=LOOP)}}
# A digit to choose, then one of 2,500 objects.
LATE_WIDE = object_of(
    k={"enum": [0, 1]}, a={"anyOf": [object_of(v={"const": f"v{i}"}) for i in range(2500)]}
)
LATE_GRAMMAR = 'start: ("x" | "y") ("x" | "y") loop\nloop: "a" loop'
SCHEMAS = {"loop": LATE_LOOP, "wide": LATE_WIDE}


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def answered(http: httpx.Client, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = send(http, path, body)
    assert response.status_code == status, response.text[:1000]
    return response.json()


def test_completions_finish_with_error(http: httpx.Client, server: LiveServer):
    body = completions(structured_outputs={"grammar": LATE_GRAMMAR}, max_tokens=ROOM)
    [choice] = answered(http, COMPLETIONS, body)["choices"]
    assert choice["finish_reason"] == "error", choice
    check_still_serving(http, server, COMPLETIONS)


@pytest.mark.parametrize("kind", SCHEMAS)
def test_chat_finishes_with_error(http: httpx.Client, server: LiveServer, kind: str):
    [choice] = answered(http, CHAT, chat(guided_json=SCHEMAS[kind], max_tokens=ROOM))["choices"]
    assert choice["finish_reason"] == "error", choice
    tools = [{"type": "function", "function": {"name": "f", "parameters": SCHEMAS[kind]}}]
    body = chat(tools=tools, tool_choice="required", max_tokens=ROOM)
    [choice] = answered(http, CHAT, body)["choices"]
    assert choice["finish_reason"] == "error", choice
    check_still_serving(http, server, CHAT)


def text_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"format": {"type": "json_schema", "name": "answer", "schema": schema}}


def response_bodies(kind: str) -> dict[str, dict[str, Any]]:
    """The field whose constraint fails -> a /v1/responses body constraining with it."""
    schema = SCHEMAS[kind]
    tools = [{"type": "function", "name": "f", "parameters": schema}]
    return {
        "text.format": responses(text=text_format(schema), max_output_tokens=ROOM),
        "tools": responses(tools=tools, tool_choice="required", max_output_tokens=ROOM),
    }


def check_failed_response(body: dict[str, Any], param: str) -> None:
    assert body["status"] == "failed", body
    error = body["error"]
    assert error["code"] == "server_error" and error["param"] == param, error
    assert error["message"].startswith(f"{param}: ") and "failed" in error["message"], error
    assert body["incomplete_details"] is None and body["usage"]["output_tokens"] > 0, body
    assert body["output"][-1]["status"] == "incomplete", body["output"]


@pytest.mark.parametrize("kind", SCHEMAS)
def test_responses_fail(http: httpx.Client, server: LiveServer, kind: str):
    for param, body in response_bodies(kind).items():
        check_failed_response(answered(http, RESPONSES, body), param)
    check_still_serving(http, server, RESPONSES)


@pytest.mark.parametrize("kind", SCHEMAS)
def test_responses_stream_ends_with_response_failed(
    http: httpx.Client, server: LiveServer, kind: str
):
    for param, body in response_bodies(kind).items():
        response = send(http, RESPONSES, {**body, "stream": True})
        assert response.status_code == 200, response.text[:1000]
        events = sse_events(response.text)
        names = [name for name, _ in events]
        assert names[:2] == ["response.created", "response.in_progress"], names
        assert names[-1] == "response.failed" and names.count("response.failed") == 1, names
        assert not {"response.completed", "response.incomplete", "error"} & set(names), names
        assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
        check_failed_response(events[-1][1]["response"], param)
    check_still_serving(http, server, RESPONSES)


def messages_body(kind: str, **fields: Any) -> dict[str, Any]:
    tools = [{"name": "f", "input_schema": SCHEMAS[kind]}]
    return messages(tools=tools, tool_choice={"type": "any"}, max_tokens=ROOM, **fields)


@pytest.mark.parametrize("kind", SCHEMAS)
def test_messages_is_a_400(http: httpx.Client, server: LiveServer, kind: str):
    error = check_anthropic_error(answered(http, MESSAGES, messages_body(kind), 400))
    assert error["type"] == "invalid_request_error", error
    assert error["message"].startswith("tools: ") and "failed" in error["message"], error
    check_still_serving(http, server, MESSAGES)


@pytest.mark.parametrize("kind", SCHEMAS)
def test_messages_stream_ends_with_an_error_event(
    http: httpx.Client, server: LiveServer, kind: str
):
    response = send(http, MESSAGES, messages_body(kind, stream=True))
    if response.status_code == 400:  # failed on the token of the engine's first output
        error = check_anthropic_error(response.json())
    else:
        assert response.status_code == 200, response.text[:1000]
        stream = parse_anthropic_stream(response.text)
        [error] = stream.errors
        names = [name for name, _ in stream.events]
        assert "message_delta" not in names and "message_stop" not in names, names
    assert error["type"] == "invalid_request_error", error
    assert error["message"].startswith("tools: ") and "failed" in error["message"], error
    check_still_serving(http, server, MESSAGES)


@pytest.mark.parametrize("kind", SCHEMAS)
def test_ollama_is_done_with_error(http: httpx.Client, server: LiveServer, kind: str):
    options = {"num_predict": ROOM}
    body = answered(http, OLLAMA_CHAT, ollama_chat(format=SCHEMAS[kind], options=options))
    assert body["done_reason"] == "error", body
    body = answered(http, OLLAMA_GENERATE, ollama_generate(format=SCHEMAS[kind], options=options))
    assert body["done_reason"] == "error", body
    check_still_serving(http, server, OLLAMA_CHAT)
    check_still_serving(http, server, OLLAMA_GENERATE)
