"""The shapes both completion routes answer in: the completion body (whole or one
chunk), usage, ids, and the SSE stream of chunks.

A stream is ``data: {chunk}`` per chunk and ``data: [DONE]`` at the end. An error
after the status line has gone out comes in-band, as an ``error`` event before
``[DONE]``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from fastapi.responses import JSONResponse, Response
from hetero_infer.server.errors import APIError
from sse_starlette.sse import EventSourceResponse

Chunk = dict[str, Any]


class Answer(Protocol):
    """A checked request's answer, whole or as chunks (completions.py, chat.py)."""

    async def whole(self) -> dict[str, Any]: ...

    def chunks(self) -> AsyncIterator[Chunk]: ...


async def respond(answer: Answer, stream: bool) -> Response:
    """The answer as JSON, or streamed as SSE. The request was checked when the answer
    was built, so a bad one is a 400 even when it asked for a stream."""
    if stream:
        return sse_response(answer.chunks())
    return JSONResponse(await answer.whole())


def completion_body(
    object_type: str,
    completion_id: str,
    model: str,
    choices: list[dict[str, Any]],
    usage_value: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A completion or chunk body; ``usage`` appears only when given."""
    body = {
        "id": completion_id,
        "object": object_type,
        "created": now(),
        "model": model,
        "choices": choices,
    }
    if usage_value is not None:
        body["usage"] = usage_value
    return body


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def sse_response(chunks: AsyncIterator[Chunk]) -> EventSourceResponse:
    return EventSourceResponse(_events(chunks), ping=0, sep="\n")


async def _events(chunks: AsyncIterator[Chunk]) -> AsyncIterator[dict[str, str]]:
    try:
        async for chunk in chunks:
            yield {"data": json.dumps(chunk, ensure_ascii=False)}
    except APIError as exc:
        # The status line has gone out already: report in-band, then end.
        yield {"event": "error", "data": json.dumps(exc.body())}
    yield {"data": "[DONE]"}
