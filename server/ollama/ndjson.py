"""Ollama's streams: one JSON object a line (application/x-ndjson).

As the OpenAI routes' SSE streams (responses.py), the status line waits for the first
chunk, so a request refused before its first output (a full queue) still gets its
status code; an error after the status line comes in-band, as ``{"error": ...}``, the
stream's last line (the ollama client raises it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse
from hetero_infer.server.errors import APIError
from hetero_infer.server.json_line import json_line
from hetero_infer.server.ollama.errors import error_body, error_response
from hetero_infer.server.ollama.generation import Body, Generation
from hetero_infer.server.serving.answer_parts import prepend

NDJSON = "application/x-ndjson"


async def respond(answer: Generation, stream: bool) -> Response:
    if not stream:
        return JSONResponse(await answer.whole())
    chunks = answer.chunks()
    try:
        first = await answer.ctx.until_disconnect(anext(chunks, None))
    except APIError as error:
        return error_response(error)
    rest = chunks if first is None else prepend(first, chunks)
    return StreamingResponse(_lines(rest), media_type=NDJSON)


async def _lines(chunks: AsyncIterator[Body]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield _line(chunk)
    except APIError as exc:
        yield _line(error_body(exc))


def _line(body: dict) -> bytes:
    return json_line(body).encode() + b"\n"
