"""/v1/chat/completions: the body is a ChatPlan, which ChatRun (serving/chat_run.py)
makes one engine request (n choices); its outputs become a chat completion or a stream
of chunks.

Each choice's text goes through the run's ChatOutputParser (chat_output.py): reasoning,
content and tool calls, whole or streamed alike. A stream opens with one chunk per
choice carrying ``delta.role``; choices interleave by ``index``. With continuous usage
stats every chunk carries the usage so far (all choices' tokens).

With use_beam_search the n beams of the search are the choices, best first, each read
by its parser as a whole answer; a stream sends each whole once the search ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.server.openai.chat_request import ChatCompletionRequest
from hetero_infer.server.openai.completions import beam_finals, beam_outputs
from hetero_infer.server.openai.responses import Chunk, completion_body, usage
from hetero_infer.server.serving.answer_parts import new_id, prepend
from hetero_infer.server.serving.chat_images import image_sources, load_images
from hetero_infer.server.serving.chat_output import (
    ChatOutputParser,
    MessageDelta,
    tool_calls_body,
    tool_calls_delta,
)
from hetero_infer.server.serving.chat_run import ChatRun
from hetero_infer.server.serving.logprobs import LogprobsFormatter
from hetero_infer.server.serving.reasoning import ThinkingTokens, end_mark_tokens
from hetero_infer.server.serving.request_context import RequestContext


class ChatCompletion:
    """One /v1/chat/completions request: its ChatRun, and the answer."""

    def __init__(self, ctx: RequestContext, body: ChatCompletionRequest, run: ChatRun) -> None:
        self.ctx = ctx
        self.run = run
        self.id = body.answer_id(run.request.request_id, "chatcmpl")
        self.n = run.request.params.n
        self.include_usage = body.include_usage
        self.continuous_usage = body.continuous_usage
        as_ids = bool(body.return_tokens_as_token_ids)
        tokenizer = ctx.engine.tokenizer
        self.formatter = LogprobsFormatter(tokenizer, as_ids) if body.logprobs else None
        self.prompt_formatter = None  # vLLM's prompt_logprobs
        if body.prompt_logprobs is not None:
            self.prompt_formatter = self.formatter or LogprobsFormatter(tokenizer, as_ids)
        self.token_ids = bool(body.return_token_ids)
        self.top_logprobs = body.top_logprobs or 0
        self.include_reasoning = body.include_reasoning
        last = body.messages[-1]
        self.echoed = last.template_content() if body.echo and last.role == "assistant" else ""
        self.cached_tokens = 0  # of the prompt, from choice 0's outputs (the choices share it)
        # Each choice's thinking in tokens, with the server's reasoning parser.
        self.thinking: list[ThinkingTokens] | None = None
        if run.reasoning is not None:
            self.thinking = [ThinkingTokens(end_mark_tokens(tokenizer)) for _ in range(self.n)]

    @classmethod
    async def build(cls, ctx: RequestContext, body: ChatCompletionRequest) -> ChatCompletion:
        """The checked request: its images loaded, then ChatRun.build (the template, the
        tools, the params)."""
        images = await load_images(ctx, image_sources(body.messages), body.mm_processor_kwargs)
        return cls(ctx, body, ChatRun.build(ctx, body, new_id("chatcmpl"), images))

    async def whole(self) -> dict[str, Any]:
        run = self.run
        if run.beam is not None:
            [finals] = await beam_finals(self.ctx, [run.request], run.beam)
        else:
            [finals] = await self.ctx.run_to_end([run.request])
        choices = []
        for final in finals:
            parser = run.output_parser()
            message = parser.parse(final.text)
            self._count_thinking(final.index, final.token_ids, message)
            message.content = self.echoed + message.content
            choices.append(
                {
                    "index": final.index,
                    "message": self._message(message),
                    "logprobs": self._logprobs(final.token_ids, final.logprobs),
                    "finish_reason": _finish_reason(final, parser),
                    "stop_reason": final.stop_reason,
                }
            )
            if self.token_ids:
                choices[-1]["token_ids"] = list(final.token_ids)
        generated = sum(len(final.token_ids) for final in finals)
        self.cached_tokens = finals[0].num_cached_tokens if finals else 0
        body = completion_body(
            "chat.completion", self.id, self.ctx.model_name, choices, self._usage(generated)
        )
        return self._with_prompt_extras(body, finals[0].prompt_logprobs if finals else None)

    async def chunks(self) -> AsyncIterator[Chunk]:
        run = self.run
        if run.beam is not None:
            outputs = beam_outputs(self.ctx, run.request, run.beam)
        else:
            outputs = self.ctx.outputs(run.request)
        # The role chunks wait for the engine's first output (as vLLM's do): until
        # then the request may still be refused, and respond() holds the status line.
        first = await anext(outputs)
        generated = 0
        for index in range(self.n):
            role = {"role": "assistant", "content": ""}
            choice = {"index": index, "delta": role, "finish_reason": None}
            chunk = self._chunk([choice], self._usage_so_far(generated))
            yield self._with_prompt_extras(chunk, first.prompt_logprobs) if index == 0 else chunk
            if self.echoed:
                echo = {"index": index, "delta": {"content": self.echoed}, "finish_reason": None}
                yield self._chunk([echo], self._usage_so_far(generated))
        # Per choice: output tokens (and logprob entries) whose chunk is still to come.
        pending: list[tuple[list[int], list[dict[int, float]]]] = [([], []) for _ in range(self.n)]
        parsers = [run.output_parser() for _ in range(self.n)]
        async for out in prepend(first, outputs):  # deltas
            generated += len(out.delta_token_ids)
            if out.index == 0:
                self.cached_tokens = out.num_cached_tokens
            parser = parsers[out.index]
            pending[out.index][0].extend(out.token_ids)
            if self.formatter is not None:
                pending[out.index][1].extend(out.logprobs or [])
            delta = parser.feed(out.delta_text) if out.delta_text else MessageDelta()
            if out.finished:
                delta.add(parser.finish())
            self._count_thinking(out.index, out.delta_token_ids, delta)
            if not self.include_reasoning:
                delta.reasoning = ""
            # Logprobs of tokens without text yet (or held back) ride on a later chunk.
            if not (delta or out.finished):
                continue
            choice = {
                "index": out.index,
                "delta": _delta_body(delta),
                "logprobs": self._logprobs(*pending[out.index]),
                "finish_reason": _finish_reason(out, parser),
                "stop_reason": out.stop_reason,
            }
            if self.token_ids:
                choice["token_ids"] = pending[out.index][0]
            pending[out.index] = ([], [])
            yield self._chunk([choice], self._usage_so_far(generated))
        if self.include_usage:
            yield self._chunk([], self._usage(generated))

    def _message(self, message: MessageDelta) -> dict[str, Any]:
        body: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls or message.reasoning:
            body["content"] = message.content or None  # (OpenAI's null beside calls)
        if message.tool_calls:
            body["tool_calls"] = tool_calls_body(message.tool_calls)
        if self.run.reasoning:
            body["reasoning_content"] = (self.include_reasoning and message.reasoning) or None
        return body

    def _with_prompt_extras(
        self, body: dict[str, Any], prompt_logprobs: list[dict[int, float] | None] | None
    ) -> dict[str, Any]:
        """vLLM's extras of the prompt, in the answer (a stream's first chunk): the ids
        return_token_ids asks for, and prompt_logprobs."""
        if self.token_ids:
            body["prompt_token_ids"] = self.run.request.prompt_token_ids
        if self.prompt_formatter is not None and prompt_logprobs is not None:
            body["prompt_logprobs"] = self.prompt_formatter.prompt(prompt_logprobs)
        return body

    def _count_thinking(self, index: int, token_ids: list[int], message: MessageDelta) -> None:
        if self.thinking is not None:
            self.thinking[index].add(token_ids)
            self.thinking[index].reasoned |= bool(message.reasoning)

    def _usage(self, generated: int) -> dict[str, Any]:
        """The usage so far; with prompt tokens details on, the prompt's cached tokens;
        with a reasoning parser, the output's thinking tokens."""
        details = self.ctx.settings.enable_prompt_tokens_details
        cached = self.cached_tokens if details else None
        thinking = None if self.thinking is None else sum(t.count for t in self.thinking)
        return usage(self.run.prompt_tokens, generated, cached, thinking)

    def _usage_so_far(self, generated: int) -> dict[str, Any] | None:
        """With continuous usage stats, the usage a content chunk carries."""
        return self._usage(generated) if self.continuous_usage else None

    def _logprobs(
        self, token_ids: list[int], entries: list[dict[int, float]] | None
    ) -> dict[str, Any] | None:
        """Chat logprobs of these output tokens; None unless asked."""
        if self.formatter is None:
            return None
        assert entries is not None
        return self.formatter.chat(token_ids, entries, self.top_logprobs)

    def _chunk(
        self, choices: list[dict[str, Any]], usage_value: dict[str, Any] | None = None
    ) -> Chunk:
        return completion_body(
            "chat.completion.chunk",
            self.id,
            self.ctx.model_name,
            choices,
            usage_value,
        )


def _delta_body(delta: MessageDelta) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if delta.reasoning:
        body["reasoning_content"] = delta.reasoning
    if delta.content:
        body["content"] = delta.content
    if delta.tool_calls:
        body["tool_calls"] = tool_calls_delta(delta.tool_calls)
    return body


def _finish_reason(out: RequestOutput, parser: ChatOutputParser) -> str | None:
    """ "tool_calls" where an answer that ended by itself made calls."""
    if out.finish_reason == "stop" and parser.made_calls:
        return "tool_calls"
    return out.finish_reason
