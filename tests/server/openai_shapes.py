"""OpenAI's shapes that server tests hold answers to: the error body, and an SSE stream
(``data: {chunk}`` lines, error events in-band, ``data: [DONE]`` last)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def check_error_body(body: Any) -> dict[str, Any]:
    """``{"error": {"message": str, "type": str, "param": str | null, "code": str}}``,
    nothing more (the code is a string, as OpenAI's); returns the inner error."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert isinstance(error["code"], str) and error["code"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    return error


@dataclass
class Stream:
    """A whole SSE answer, parsed: its chunks, and the errors it reported in-band."""

    chunks: list[dict[str, Any]]
    errors: list[dict[str, Any]]


def parse_stream(text: str) -> Stream:
    """The events of an SSE answer; fails unless every ``data`` is a JSON object or the
    final ``[DONE]``, and every error event is in OpenAI's shape."""
    chunks: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    done = False
    for event in text.replace("\r\n", "\n").strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in event.split("\n") if ": " in line)
        assert not done, f"an event after [DONE]: {event!r}"
        assert "data" in fields, f"an event without data: {event!r}"
        if fields["data"] == "[DONE]":
            done = True
            continue
        payload = json.loads(fields["data"])
        if fields.get("event") == "error":
            errors.append(check_error_body(payload))
        else:
            assert isinstance(payload, dict), payload
            chunks.append(payload)
    assert done, f"the stream did not end with [DONE]: {text[-200:]!r}"
    return Stream(chunks, errors)
