"""/v1/chat/completions: the messages through the model's chat template become one
engine request (n choices), its outputs a chat completion or a stream of chunks.

A stream opens with one chunk per choice carrying ``delta.role``; choices interleave
by ``index``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from hetero_infer.engine.frontend.input_processor import EngineRequest
from hetero_infer.engine.outputs import RequestOutput
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.logprobs import LogprobsFormatter
from hetero_infer.server.openai.protocol import ChatCompletionRequest
from hetero_infer.server.openai.responses import Chunk, completion_body, new_id, usage
from hetero_infer.server.openai.serving import RequestContext


class ChatCompletion:
    """One /v1/chat/completions request: its engine request, and the answer."""

    def __init__(
        self, ctx: RequestContext, body: ChatCompletionRequest, request: EngineRequest
    ) -> None:
        self.ctx = ctx
        self.request = request
        self.n = request.params.n
        self.include_usage = body.include_usage
        self.formatter = LogprobsFormatter(ctx.engine.tokenizer) if body.logprobs else None
        self.top_logprobs = body.top_logprobs or 0
        self.prompt_tokens = len(request.prompt_token_ids)

    @classmethod
    def build(cls, ctx: RequestContext, body: ChatCompletionRequest) -> ChatCompletion:
        """The messages through the chat template, checked, then the params (max_tokens
        fits the context)."""
        messages = body.template_messages()
        try:
            token_ids = ctx.engine.tokenizer.apply_chat_template(messages)
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from exc
        processor = ctx.engine.input_processor
        prompt = processor.tokenize(token_ids)
        requested = body.max_completion_tokens or body.max_tokens
        defaults = ctx.engine.generation_defaults.sampling
        params = body.sampling_params(ctx.max_tokens(prompt, requested), defaults)
        request = processor.request(new_id("chatcmpl"), prompt, params, body.priority, body.timeout)
        return cls(ctx, body, request)

    async def whole(self) -> dict[str, Any]:
        [finals] = await self.ctx.run_to_end([self.request])
        choices = [
            {
                "index": final.index,
                "message": {"role": "assistant", "content": final.text},
                "logprobs": self._logprobs(final, 0),
                "finish_reason": final.finish_reason,
                "stop_reason": final.stop_reason,
            }
            for final in finals
        ]
        generated = sum(len(final.token_ids) for final in finals)
        return completion_body(
            "chat.completion",
            self.request.request_id,
            self.ctx.model_name,
            choices,
            usage(self.prompt_tokens, generated),
        )

    async def chunks(self) -> AsyncIterator[Chunk]:
        for index in range(self.n):
            role = {"role": "assistant", "content": ""}
            yield self._chunk([{"index": index, "delta": role, "finish_reason": None}])
        generated = 0
        sent_tokens = [0] * self.n  # per choice: output tokens whose logprobs are out
        async for out in self.ctx.outputs(self.request):
            generated += len(out.delta_token_ids)
            # Logprobs of tokens without text yet ride on a later chunk.
            if not (out.delta_text or out.finished):
                continue
            choice = {
                "index": out.index,
                "delta": {"content": out.delta_text} if out.delta_text else {},
                "logprobs": self._logprobs(out, sent_tokens[out.index]),
                "finish_reason": out.finish_reason,
                "stop_reason": out.stop_reason,
            }
            sent_tokens[out.index] = len(out.token_ids)
            yield self._chunk([choice])
        if self.include_usage:
            yield self._chunk([], usage(self.prompt_tokens, generated))

    def _logprobs(self, out: RequestOutput, start: int) -> dict[str, Any] | None:
        """Chat logprobs of the output's tokens from ``start`` on; None unless asked."""
        if self.formatter is None:
            return None
        assert out.logprobs is not None
        return self.formatter.chat(out.token_ids[start:], out.logprobs[start:], self.top_logprobs)

    def _chunk(
        self, choices: list[dict[str, Any]], usage_value: dict[str, int] | None = None
    ) -> Chunk:
        return completion_body(
            "chat.completion.chunk",
            self.request.request_id,
            self.ctx.model_name,
            choices,
            usage_value,
        )
