"""One /api/chat or /api/generate request's answer: one JSON object, or NDJSON chunks.

Each chunk is ``{"model", "created_at", <the piece>, "done": false}``; the piece is
``message`` (chat: role, content, thinking, tool_calls) or ``response`` and
``thinking`` (generate). The last object has ``done: true``, ``done_reason`` and the
timings in nanoseconds (total_duration from the request's arrival, prompt_eval_duration
its prefill, eval_duration its decoding; load_duration 0: the model is always loaded);
generate's carries ``context`` (prompt and output token ids) unless raw.

The text goes through the serving layer's ChatOutputParser (reasoning, content, tool
calls), so every API splits an answer alike. Ollama sends a tool call whole, its
arguments as an object: calls go out in one chunk once the output has ended; a call
whose arguments are not a complete JSON object (cut off by num_predict) is left out.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.frontend.input_processor import EngineRequest
from hetero_infer.server.serving.chat_output import ChatOutputParser, MessageDelta, tool_calls_body
from hetero_infer.server.serving.logprobs import LogprobsFormatter
from hetero_infer.server.serving.request_context import RequestContext
from hetero_infer.server.serving.tool_parsers import ToolCallDelta

Body = dict[str, Any]


class Generation:
    def __init__(
        self,
        ctx: RequestContext,
        request: EngineRequest,
        model: str,
        new_parser: Callable[[], ChatOutputParser],
        *,
        chat: bool,
        returns_context: bool,
        top_logprobs: int | None,
        start: float,
    ) -> None:
        """``start``: the request's arrival (time.monotonic()), for total_duration."""
        self.ctx = ctx
        self.request = request
        self.model = model
        self.new_parser = new_parser
        self.chat = chat
        self.returns_context = returns_context
        self.top_logprobs = top_logprobs or 0
        self.formatter = (
            LogprobsFormatter(ctx.engine.tokenizer) if top_logprobs is not None else None
        )
        self.start = start

    async def whole(self) -> Body:
        [[final]] = await self.ctx.run_to_end([self.request])
        message = self.new_parser().parse(final.text)
        body = self._body(message.content, message.reasoning, message.tool_calls)
        body.update(self._logprobs(final.token_ids, final.logprobs))
        return self._final(body, final, final.token_ids)

    async def chunks(self) -> AsyncIterator[Body]:
        parser = self.new_parser()
        calls: list[ToolCallDelta] = []
        output_ids: list[int] = []
        # Tokens (and their logprobs) whose text has not gone out yet.
        pending: tuple[list[int], list[dict[int, float]]] = ([], [])
        async for out in self.ctx.outputs(self.request):  # deltas
            output_ids.extend(out.delta_token_ids)
            pending[0].extend(out.delta_token_ids)
            pending[1].extend(out.logprobs or [])
            delta = parser.feed(out.delta_text) if out.delta_text else MessageDelta()
            if out.finished:
                delta.add(parser.finish())
            calls.extend(delta.tool_calls)
            if delta.content or delta.reasoning:
                body = self._body(delta.content, delta.reasoning)
                body.update(self._logprobs(*pending))
                pending = ([], [])
                yield {**body, "done": False}
            if out.finished:
                if calls:
                    yield {**self._body("", "", calls), "done": False}
                body = self._body("", "")
                body.update(self._logprobs(*pending))
                yield self._final(body, out, output_ids)

    def _body(self, content: str, thinking: str, calls: list[ToolCallDelta] | None = None) -> Body:
        """The model and time, and the piece of the answer."""
        body: Body = {"model": self.model, "created_at": timestamp()}
        piece: Body = (
            {"role": "assistant", "content": content} if self.chat else {"response": content}
        )
        if thinking:
            piece["thinking"] = thinking
        if calls:
            piece["tool_calls"] = ollama_tool_calls(calls)
        if self.chat:
            body["message"] = piece
        else:
            body.update(piece)
        return body

    def _final(self, body: Body, final: RequestOutput, output_ids: list[int]) -> Body:
        body["done"] = True
        body.update(self._stats(final, len(output_ids)))
        if self.returns_context:
            body["context"] = [*self.request.prompt_token_ids, *output_ids]
        return body

    def _stats(self, final: RequestOutput, generated: int) -> Body:
        metrics = final.metrics
        end = metrics.finished_time or time.monotonic()
        first_token = metrics.first_token_time or end
        scheduled = metrics.first_scheduled_time or metrics.arrival_time
        return {
            "done_reason": final.finish_reason,
            "total_duration": nanoseconds(end - self.start),
            "load_duration": 0,
            "prompt_eval_count": len(self.request.prompt_token_ids),
            # Ollama's: those of them read from the cache (the count above holds them).
            "prompt_eval_cached_count": final.num_cached_tokens,
            "prompt_eval_duration": nanoseconds(first_token - scheduled),
            "eval_count": generated,
            "eval_duration": nanoseconds(end - first_token),
        }

    def _logprobs(self, token_ids: list[int], entries: list[dict[int, float]] | None) -> Body:
        """``logprobs`` of these tokens, when asked: Ollama's entries are the chat
        route's (token, logprob, bytes, top_logprobs)."""
        if self.formatter is None or not token_ids:
            return {}
        assert entries is not None
        return {"logprobs": self.formatter.chat(token_ids, entries, self.top_logprobs)["content"]}


def ollama_tool_calls(deltas: list[ToolCallDelta]) -> list[Body]:
    """Whole calls as Ollama sends them: arguments as an object."""
    calls = []
    for call in tool_calls_body(deltas):
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            continue
        if isinstance(arguments, dict):
            function = {"index": len(calls), "name": call["function"]["name"]}
            calls.append({"id": call["id"], "function": {**function, "arguments": arguments}})
    return calls


def load_answer(model: str, chat: bool) -> Body:
    """Ollama's answer to a request with nothing to generate: it loads the model."""
    piece: Body = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return {"model": model, "created_at": timestamp(), **piece, "done": True, "done_reason": "load"}


def timestamp() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def nanoseconds(seconds: float) -> int:
    return max(0, round(seconds * 1e9))
