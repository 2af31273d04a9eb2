"""The transport of /v1/responses: the answer whole as JSON, or its events as
server-sent events, each ``event: <type>`` and ``data: {...}`` with a
``sequence_number`` counted from 0, and no ``[DONE]`` (OpenAI's Responses streams end
with their response.completed, response.incomplete or response.failed event).

As for the completion routes (responses.respond), the status line waits for the first
event, which waits for the engine's first output: a request refused until then gets
its status code. An error after that comes in-band as an ``error`` event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response
from hetero_infer.server.errors import APIError, error_response
from hetero_infer.server.json_line import json_line
from hetero_infer.server.openai.responses import Answer
from hetero_infer.server.serving.answer_parts import prepend
from sse_starlette.sse import EventSourceResponse

Event = dict[str, Any]


async def respond_events(answer: Answer, stream: bool) -> Response:
    """The answer as JSON, or its events as SSE."""
    if not stream:
        return JSONResponse(await answer.whole())
    events = answer.chunks()
    try:
        first = await answer.ctx.until_disconnect(anext(events, None))
    except APIError as error:
        return error_response(error)
    if first is not None:
        events = prepend(first, events)
    return EventSourceResponse(_encoded(events), ping=0, sep="\n")


async def _encoded(events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    sequence_number = 0
    try:
        async for event in events:
            yield _encode({"type": event["type"], "sequence_number": sequence_number, **event})
            sequence_number += 1
    except APIError as exc:
        # The status line has gone out already: report in-band, then end.
        yield _encode(
            {
                "type": "error",
                "sequence_number": sequence_number,
                "code": exc.code,
                "message": exc.message,
                "param": exc.param,
            }
        )


def _encode(event: Event) -> bytes:
    data = json_line(event)
    return f"event: {event['type']}\ndata: {data}\n\n".encode()
