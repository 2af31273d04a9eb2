"""Bad requests to /v1/messages get a 400 (404 for an unknown model) in Anthropic's error
shape, naming the field, from a live server on the real engine; they leave nothing
queued, and the OpenAI routes on the same server keep OpenAI's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.server.conftest import MODEL_NAME, LiveServer, make_engine, start_server
from tests.server.openai_shapes import check_error_body
from tests.server.test_openai_tools import TEMPLATE, WEATHER_PARAMETERS

TOOLS = [{"name": "get_weather", "input_schema": WEATHER_PARAMETERS}]
GOOD: dict[str, Any] = {
    "model": MODEL_NAME,
    "max_tokens": 2,
    "messages": [{"role": "user", "content": "Hi"}],
}


@pytest.fixture(scope="module")
def live(model_dir: Path) -> Iterator[LiveServer]:
    # Tools without --enable-auto-tool-choice: tool_choice auto is refused.
    engine = make_engine(model_dir, max_model_len=1024)
    server = start_server(model_dir, engine, chat_template=TEMPLATE, max_body_bytes=MAX_BODY_BYTES)
    yield server
    server.stop()


def check_error(response: httpx.Response, status: int, kind: str, *words: str) -> str:
    """Anthropic's error shape, and nothing more; returns the message."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind, body
    message = body["error"]["message"]
    for word in words:
        assert word in message, message
    return message


def with_messages(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**GOOD, "messages": list(messages), **fields}


MAX_BODY_BYTES = 100_000
JSON_HEADERS = {"content-type": "application/json"}
USER = {"role": "user", "content": "Hi"}
BAD_BODIES = {
    "no max_tokens": ({k: v for k, v in GOOD.items() if k != "max_tokens"}, ["max_tokens"]),
    "no model": ({k: v for k, v in GOOD.items() if k != "model"}, ["model"]),
    "zero max_tokens": ({**GOOD, "max_tokens": 0}, ["max_tokens"]),
    "unknown field": ({**GOOD, "frequency_penalty": 1}, ["frequency_penalty", "unknown field"]),
    "unknown block field": (
        with_messages({"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}),
        ["messages.0.content.0", "x", "unknown field"],
    ),
    "image block without a source type": (
        with_messages({"role": "user", "content": [{"type": "image", "source": {}}]}),
        ["messages.0.content.0", "source"],
    ),
    "image from the files API": (
        with_messages(
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
            }
        ),
        ["messages.0.content.0", "image sources of type 'file' are not supported"],
    ),
    "document block": (
        with_messages({"role": "user", "content": [{"type": "document", "source": {}}]}),
        ["messages.0.content.0", "'document' are not supported"],
    ),
    "image on a text-only model": (
        with_messages(
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}
        ),
        ["messages.0.content.0", "takes no image input"],
    ),
    "tool_use in a user turn": (
        with_messages(
            {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
        ),
        ["messages.0", "user turn cannot hold a tool_use block"],
    ),
    "a final assistant turn": (
        with_messages(USER, {"role": "assistant", "content": "Sure"}),
        ["last message must be a user turn"],
    ),
    "no messages": ({**GOOD, "messages": []}, ["messages"]),
    "system role": (with_messages({"role": "system", "content": "x"}), ["messages.0.role"]),
    "temperature": ({**GOOD, "temperature": 1.5}, ["temperature"]),
    "top_k": ({**GOOD, "top_k": -1}, ["top_k"]),
    "stop_sequences": ({**GOOD, "stop_sequences": "END"}, ["stop_sequences"]),
    "tool without a schema": ({**GOOD, "tools": [{"name": "f"}]}, ["tools.0.input_schema"]),
    "tool schema no object": (
        {**GOOD, "tools": [{"name": "f", "input_schema": {"type": "string"}}]},
        ["tools.0.input_schema", "object"],
    ),
    "server tool": (
        {**GOOD, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        ["tools.0"],
    ),
    "tool_choice tool without a name": (
        {**GOOD, "tools": TOOLS, "tool_choice": {"type": "tool"}},
        ["tool_choice", "name"],
    ),
    "tool_choice names no tool": (
        {**GOOD, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}},
        ["tool_choice", "'nope'"],
    ),
    "tool_choice auto, not enabled": (
        {**GOOD, "tools": TOOLS},
        ["--enable-auto-tool-choice"],
    ),
    "duplicate tool names": (
        {**GOOD, "tools": TOOLS * 2, "tool_choice": {"type": "any"}},
        ["unique"],
    ),
    "too long for the context": ({**GOOD, "max_tokens": 5000}, ["max_tokens", "1024"]),
    "lone surrogate": (with_messages({"role": "user", "content": "a\ud800"}), ["messages.0"]),
}


@pytest.mark.parametrize(("body", "words"), BAD_BODIES.values(), ids=BAD_BODIES.keys())
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_bad_bodies(live: LiveServer, body: dict[str, Any], words: list[str], stream: bool):
    with live.client() as http:
        # As bytes: JSON escapes carry what UTF-8 cannot (a lone surrogate).
        content = json.dumps({**body, "stream": stream})
        response = http.post("/v1/messages", content=content, headers=JSON_HEADERS)
    check_error(response, 400, "invalid_request_error", *words)
    assert live.state.engine.num_pending == 0


def test_not_json(live: LiveServer):
    with live.client() as http:
        response = http.post(
            "/v1/messages", content=b"{not json", headers={"content-type": "application/json"}
        )
    check_error(response, 400, "invalid_request_error", "not valid JSON")


def test_unknown_model(live: LiveServer):
    with live.client() as http:
        response = http.post("/v1/messages", json={**GOOD, "model": "claude-nope"})
        check_error(response, 404, "not_found_error", "claude-nope")
        counted = http.post(
            "/v1/messages/count_tokens", json={"model": "claude-nope", "messages": [USER]}
        )
        check_error(counted, 404, "not_found_error")


def test_count_tokens_refuses_what_messages_refuses(live: LiveServer):
    with live.client() as http:
        response = http.post(
            "/v1/messages/count_tokens", json={"model": MODEL_NAME, "messages": [USER], "x": 1}
        )
        check_error(response, 400, "invalid_request_error", "x", "unknown field")
        # max_tokens belongs to /v1/messages only.
        response = http.post("/v1/messages/count_tokens", json=GOOD)
        check_error(response, 400, "invalid_request_error", "max_tokens")


def test_sdk_raises_its_typed_errors(live: LiveServer):
    with anthropic.Anthropic(base_url=live.url, api_key="any", max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model=MODEL_NAME, max_tokens=2, messages=[], stop_sequences=[])
        assert info.value.body["error"]["type"] == "invalid_request_error"
        with pytest.raises(anthropic.NotFoundError):
            client.messages.create(model="claude-nope", max_tokens=2, messages=[USER])


def test_openai_routes_keep_their_shape(live: LiveServer):
    with live.client() as http:
        response = http.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": []})
    assert response.status_code == 400
    error = check_error_body(response.json())
    # Refused by the body's own rule, not by whatever the chat template makes of none.
    assert error["param"] == "messages" and "at least 1 item" in error["message"]


def test_the_server_still_answers(live: LiveServer):
    with live.client() as http:
        response = http.post("/v1/messages", json=GOOD)
    assert response.status_code == 200 and response.json()["usage"]["output_tokens"] == 2
    assert live.state.engine.num_pending == 0


def test_too_large_a_body(live: LiveServer):
    big = with_messages({"role": "user", "content": "x" * MAX_BODY_BYTES})
    with live.client() as http:
        response = http.post("/v1/messages", json=big)
    check_error(response, 413, "request_too_large", str(MAX_BODY_BYTES))
