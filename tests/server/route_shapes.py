"""The shapes of the non-OpenAI route families that server tests hold answers to: the
Responses API's, Anthropic's and Ollama's error bodies and streams, and which family a
path belongs to (openai_shapes.py has OpenAI's chat and completion shapes).

- Responses (``/v1/responses``): errors in OpenAI's shape; a stream of SSE events, each
  ``event: <type>`` over data of that ``type``, ``sequence_number`` counting from 0,
  ending with ``response.completed`` or ``response.incomplete`` (or an in-band
  ``error`` event), no ``[DONE]``.
- Anthropic (``/v1/messages*``): ``{"type": "error", "error": {"type", "message"}}``;
  a stream ``message_start``, content blocks opened and closed in order,
  ``message_delta``, ``message_stop`` (or an in-band ``error`` event).
- Ollama (``/api/*``): ``{"error": "message"}``; a stream of NDJSON objects, the last
  and only the last with ``done: true`` (or an in-band ``{"error"}`` line).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.server.openai_shapes import check_error_body

Family = Literal["openai", "responses", "anthropic", "ollama"]
ANTHROPIC_ERROR_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "timeout_error",
    "request_too_large",
    "rate_limit_error",
    "overloaded_error",
    "api_error",
}
RESPONSES_ENDINGS = {"response.completed", "response.incomplete", "response.failed"}


def route_family(path: str) -> Family:
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    if path == "/v1/responses" or path.startswith("/v1/responses/"):
        return "responses"
    return "openai"


def check_anthropic_error(body: Any) -> dict[str, Any]:
    """``{"type": "error", "error": {"type": str, "message": str}}``, nothing more;
    returns the inner error."""
    assert isinstance(body, dict) and set(body) == {"type", "error"}, body
    assert body["type"] == "error", body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"type", "message"}, error
    assert error["type"] in ANTHROPIC_ERROR_TYPES, error
    assert isinstance(error["message"], str) and error["message"], error
    return error


def check_ollama_error(body: Any) -> str:
    """``{"error": str}``, nothing more; returns the message."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert isinstance(body["error"], str) and body["error"], body
    return body["error"]


def error_message(path: str, body: Any) -> str:
    """The message of an error body, checked to be in ``path``'s family's shape."""
    match route_family(path):
        case "anthropic":
            return check_anthropic_error(body)["message"]
        case "ollama":
            return check_ollama_error(body)
        case _:
            return check_error_body(body)["message"]


@dataclass
class RouteStream:
    """A whole stream, parsed: its events (name and data; an NDJSON line's name is
    empty) and the errors it reported in-band, in the family's shape."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    errors: list[Any] = field(default_factory=list)


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``(event name, data object)`` of each event of an SSE answer; every event has a
    name and one JSON object as its data (comment lines are skipped)."""
    events = []
    for block in text.replace("\r\n", "\n").strip().split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        fields = dict(line.split(": ", 1) for line in lines)
        assert set(fields) == {"event", "data"}, f"not one named event: {block!r}"
        data = json.loads(fields["data"])
        assert isinstance(data, dict), data
        events.append((fields["event"], data))
    return events


def parse_responses_stream(text: str) -> RouteStream:
    """A Responses API stream: named events, numbered from 0, each named by its type,
    from ``response.created`` to its ending (completed, incomplete or an error)."""
    stream = RouteStream()
    events = sse_events(text)
    assert events, "an empty stream"
    for number, (name, data) in enumerate(events):
        assert data.get("type") == name, (name, data)
        assert data.get("sequence_number") == number, (number, data)
        if name == "error":
            assert number == len(events) - 1, "events after an in-band error"
            assert {"code", "message", "param"} <= set(data), data
            assert isinstance(data["message"], str) and data["message"], data
            stream.errors.append(data)
        stream.events.append((name, data))
    names = [name for name, _ in events]
    assert names[0] == "response.created", names[:3]
    ending = names[-1]
    assert ending in RESPONSES_ENDINGS | {"error"}, f"the stream ended with {ending}"
    assert not RESPONSES_ENDINGS & set(names[:-1]), f"events after the ending: {names}"
    if ending in RESPONSES_ENDINGS:
        status = events[-1][1]["response"]["status"]
        assert status == ending.removeprefix("response."), (ending, status)
    return stream


def parse_anthropic_stream(text: str) -> RouteStream:
    """An Anthropic Messages stream: ``message_start``; content blocks, each started,
    given deltas at its own index and stopped before the next starts; ``message_delta``
    with a stop reason; ``message_stop``. ``ping`` anywhere after the start."""
    stream = RouteStream()
    events = sse_events(text)
    assert events, "an empty stream"
    open_block: int | None = None
    blocks = 0
    for name, data in events:
        if name == "error":
            stream.errors.append(check_anthropic_error(data))
            continue
        assert not stream.errors, "events after an in-band error"
        assert data.get("type") == name, (name, data)
        stream.events.append((name, data))
        if name == "content_block_start":
            assert open_block is None and data["index"] == blocks, (open_block, data)
            open_block = blocks
            blocks += 1
        elif name == "content_block_delta":
            assert data["index"] == open_block, (open_block, data)
        elif name == "content_block_stop":
            assert data["index"] == open_block, (open_block, data)
            open_block = None
    names = [name for name, _ in stream.events]
    assert names and names[0] == "message_start", names[:3]
    if stream.errors:
        return stream
    assert names[-2:] == ["message_delta", "message_stop"], names[-3:]
    assert open_block is None, "a content block never stopped"
    assert names.count("message_start") == names.count("message_stop") == 1, names
    assert stream.events[-2][1]["delta"]["stop_reason"], stream.events[-2]
    return stream


def parse_ndjson_stream(text: str) -> RouteStream:
    """An Ollama stream: one JSON object a line, the last (and only it) ``done: true``
    with a ``done_reason``, unless the last is an in-band ``{"error"}``."""
    stream = RouteStream()
    lines = text.strip("\n").split("\n")
    assert lines and lines[0], "an empty stream"
    for number, line in enumerate(lines):
        data = json.loads(line)
        assert isinstance(data, dict), data
        if "error" in data:
            assert number == len(lines) - 1, "lines after an in-band error"
            stream.errors.append(check_ollama_error(data))
            continue
        last = number == len(lines) - 1
        assert data.get("done") is last, f"line {number} of {len(lines)}: {data}"
        stream.events.append(("", data))
    if not stream.errors:
        assert stream.events[-1][1].get("done_reason"), stream.events[-1]
    return stream
