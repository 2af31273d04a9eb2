"""A /v1/messages answer as Anthropic's event stream (SSE with ``event:`` names):

    message_start (the message, empty content, its input tokens)
    per block: content_block_start, content_block_delta..., content_block_stop
    message_delta (stop_reason, stop_sequence, usage.output_tokens)
    message_stop

A ``ping`` follows the first content_block_start (where Anthropic sends it; before
message_delta when no block opens), and every PING_SECONDS while the stream is quiet.
Blocks open in the order their text arrives: thinking (``thinking_delta``), text
(``text_delta``), one tool_use per call (``input_json_delta``: the arguments' JSON as
it is generated). message_start waits for the engine's first output, so a request
refused until then (or whose constraint fails on its first token) gets its status
code; an error after that comes in-band, as an ``error`` event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi.responses import JSONResponse, Response
from hetero_infer.server.anthropic.errors import error_body, error_response
from hetero_infer.server.anthropic.messages import (
    AnthropicMessage,
    constraint_failed,
    ending,
    message_body,
    new_id,
    thinking_block,
    usage,
)
from hetero_infer.server.errors import APIError
from hetero_infer.server.json_line import json_line
from hetero_infer.server.serving.answer_parts import prepend
from hetero_infer.server.serving.chat_output import MessageDelta
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

# (event name, data)
Event = tuple[str, dict[str, Any]]
PING: Event = ("ping", {"type": "ping"})
PING_SECONDS = 15


async def respond(answer: AnthropicMessage, stream: bool) -> Response:
    """The message as JSON, or its events as SSE once the first is ready."""
    if not stream:
        return JSONResponse(await answer.whole())
    events = message_events(answer)
    try:
        first = await answer.ctx.until_disconnect(anext(events))
    except APIError as error:
        return error_response(error)
    return EventSourceResponse(
        _encoded(prepend(first, events)),
        ping=PING_SECONDS,
        ping_message_factory=lambda: ServerSentEvent(data=json.dumps(PING[1]), event="ping"),
        sep="\n",
    )


async def message_events(answer: AnthropicMessage) -> AsyncIterator[Event]:
    outputs = answer.ctx.outputs(answer.request)
    first = await anext(outputs)
    if first.finish_reason == "error":
        raise constraint_failed()  # nothing sent yet: the answer's status says it
    generated = len(first.delta_token_ids)
    start_usage = usage(answer.input_tokens, first.num_cached_tokens, generated)
    start = message_body(answer.message_id, answer.ctx.model_name, [], None, None, start_usage)
    yield "message_start", {"type": "message_start", "message": start}
    blocks = BlockEvents()
    parser = answer.run.output_parser()
    pinged = False
    async for out in prepend(first, outputs):
        if out is not first:
            generated += len(out.delta_token_ids)
        delta = parser.feed(out.delta_text) if out.delta_text else MessageDelta()
        if out.finished:
            delta.add(parser.finish())
        for event in blocks.add(delta):
            yield event
            if not pinged and event[0] == "content_block_start":
                pinged = True
                yield PING
        if out.finished:
            for event in blocks.close():
                yield event
            if not pinged:
                yield PING
            stop_reason, stop_sequence = ending(out, parser.made_calls)
            delta_body = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
            yield (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": delta_body,
                    "usage": {"output_tokens": generated},
                },
            )
            yield "message_stop", {"type": "message_stop"}


class BlockEvents:
    """One answer's parsed pieces as content block events, each block opened when its
    first piece arrives and closed when a piece of another block does."""

    def __init__(self) -> None:
        self._open: tuple[str, int] | None = None  # (kind, tool call index) of the open block
        self._next_index = 0

    def add(self, delta: MessageDelta) -> Iterator[Event]:
        if delta.reasoning:
            yield from self._switch(("thinking", -1), thinking_block(""))
            yield self._delta({"type": "thinking_delta", "thinking": delta.reasoning})
        if delta.content:
            yield from self._switch(("text", -1), {"type": "text", "text": ""})
            yield self._delta({"type": "text_delta", "text": delta.content})
        for call in delta.tool_calls:
            if call.name is not None:  # a call's first piece
                start = {"type": "tool_use", "id": new_id("toolu"), "name": call.name, "input": {}}
                yield from self._switch(("tool_use", call.index), start)
            if call.arguments:
                yield self._delta({"type": "input_json_delta", "partial_json": call.arguments})

    def close(self) -> Iterator[Event]:
        if self._open is not None:
            yield "content_block_stop", {"type": "content_block_stop", "index": self._index}
            self._open = None

    @property
    def _index(self) -> int:
        return self._next_index - 1

    def _switch(self, kind: tuple[str, int], block: dict[str, Any]) -> Iterator[Event]:
        if self._open == kind:
            return
        yield from self.close()
        self._open = kind
        self._next_index += 1
        yield (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": self._index,
                "content_block": block,
            },
        )

    def _delta(self, delta: dict[str, Any]) -> Event:
        return "content_block_delta", {
            "type": "content_block_delta",
            "index": self._index,
            "delta": delta,
        }


async def _encoded(events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    """Each event as ``event: name`` and one ``data:`` line (compact JSON has no line
    breaks); an error after the status line went out is reported in-band."""
    try:
        async for name, data in events:
            yield _event(name, data)
    except APIError as exc:
        yield _event("error", error_body(exc))


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json_line(data)}\n\n".encode()
