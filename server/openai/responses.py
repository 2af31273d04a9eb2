"""The shapes both completion routes answer in: the completion body (whole or one
chunk), usage, and the SSE stream of chunks (ids and timestamps: serving/answer_parts.py).

A stream is ``data: {chunk}`` per chunk and ``data: [DONE]`` at the end. Its status
line waits for the first chunk, so a request refused before its first output still
gets its status code; an error after the status line has gone out comes in-band, as an
``error`` event before ``[DONE]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from fastapi.responses import JSONResponse, Response
from hetero_infer.server.errors import APIError, error_response
from hetero_infer.server.json_line import json_line
from hetero_infer.server.serving.answer_parts import now, prepend
from sse_starlette.sse import EventSourceResponse

if TYPE_CHECKING:
    from hetero_infer.server.serving.request_context import RequestContext

Chunk = dict[str, Any]


class Answer(Protocol):
    """A checked request's answer, whole or as chunks (completions.py, chat.py)."""

    ctx: RequestContext

    async def whole(self) -> dict[str, Any]: ...

    def chunks(self) -> AsyncIterator[Chunk]: ...


async def respond(answer: Answer, stream: bool) -> Response:
    """The answer as JSON, or streamed as SSE. The request was checked when the answer
    was built, so a bad one is a 400 even when it asked for a stream. A stream's status
    line waits for its first chunk, which waits for the engine's first output: a request
    refused until then (a full queue, too long in it) gets its 503 with Retry-After,
    which a load balancer acts on, not a 200 and an error event."""
    if not stream:
        return JSONResponse(await answer.whole())
    chunks = answer.chunks()
    try:
        first = await answer.ctx.until_disconnect(anext(chunks, None))
    except APIError as error:
        return error_response(error)
    return sse_response(chunks if first is None else prepend(first, chunks))


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


def usage(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
    reasoning_tokens: int | None = None,
) -> dict[str, Any]:
    """OpenAI's usage; ``cached_tokens``: the prompt tokens the prefix cache held, given
    as prompt_tokens_details where the server enables it; ``reasoning_tokens``: the
    output's thinking, as completion_tokens_details (None: left out)."""
    body: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if reasoning_tokens is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return body


def sse_response(chunks: AsyncIterator[Chunk]) -> EventSourceResponse:
    return EventSourceResponse(_events(chunks), ping=0, sep="\n")


async def _events(chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
    """The chunks as SSE events, encoded here: compact JSON has no line breaks, so each
    is one ``data:`` line (sse-starlette passes bytes through as they are, where a dict
    would become an event object to encode, for every token of every stream)."""
    try:
        async for chunk in chunks:
            yield _event(chunk)
    except APIError as exc:
        # The status line has gone out already: report in-band, then end.
        yield b"event: error\n" + _event(exc.body())
    yield b"data: [DONE]\n\n"


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json_line(body).encode() + b"\n\n"
