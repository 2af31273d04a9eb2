"""/v1/chat/completions: the messages (and tools) through the model's chat template
become one engine request (n choices), its outputs a chat completion or a stream of
chunks.

Each choice's text goes through a ChatOutputParser (chat_output.py): reasoning, content
and tool calls, whole or streamed alike. A stream opens with one chunk per choice
carrying ``delta.role``; choices interleave by ``index``. With continuous usage stats
every chunk carries the usage so far (all choices' tokens).

With use_beam_search the n beams of the search are the choices, best first, each read
by its parser as a whole answer; a stream sends each whole once the search ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from hetero_infer.engine.entrypoints.beam_search import BeamSearchParams, num_candidates
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.frontend.input_processor import EngineRequest
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.chat_request import ChatCompletionRequest
from hetero_infer.server.openai.completions import beam_finals, beam_outputs
from hetero_infer.server.openai.responses import Chunk, completion_body, usage
from hetero_infer.server.serving.answer_parts import new_id, prepend
from hetero_infer.server.serving.chat_output import (
    ChatOutputParser,
    MessageDelta,
    tool_calls_body,
    tool_calls_delta,
)
from hetero_infer.server.serving.logprobs import LogprobsFormatter
from hetero_infer.server.serving.reasoning import reasoning_parser
from hetero_infer.server.serving.request_context import RequestContext
from hetero_infer.server.serving.tool_use import ToolUse, tool_use


class ChatCompletion:
    """One /v1/chat/completions request: its engine request, and the answer."""

    def __init__(
        self,
        ctx: RequestContext,
        body: ChatCompletionRequest,
        request: EngineRequest,
        tools: ToolUse,
        beam: BeamSearchParams | None = None,
    ) -> None:
        """``beam``: the search's params, for use_beam_search."""
        self.ctx = ctx
        self.beam = beam
        self.request = request
        self.id = body.answer_id(request.request_id, "chatcmpl")
        self.tools = tools
        self.n = request.params.n
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
        self.prompt_tokens = len(request.prompt_token_ids)
        # A grammar constrains the output from its first token: no thinking to split off.
        reasoning = ctx.settings.reasoning_parser
        self.reasoning = reasoning if request.grammar is None else None

    @classmethod
    def build(cls, ctx: RequestContext, body: ChatCompletionRequest) -> ChatCompletion:
        """The messages and tools through the chat template, checked, then the params
        (max_tokens fits the context; a constrained tool_choice's schema)."""
        tools = tool_use(body, ctx.settings)
        body.check_template_flags()
        token_ids = ctx.chat_prompt(
            body.template_messages(),
            tools=tools.template_tools,
            template_kwargs=body.template_kwargs(),
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
        )
        processor = ctx.engine.input_processor
        prompt = body.truncated(processor.tokenize(token_ids), processor)
        requested = body.requested_max_tokens()
        defaults = ctx.engine.generation_defaults.sampling
        max_tokens = ctx.max_tokens(prompt, requested)
        beam = None
        if body.use_beam_search:
            if tools.json_schema is not None:
                raise APIError(
                    400, "a constrained 'tool_choice' cannot be used with beam search",
                    param="tool_choice",
                )  # fmt: skip
            params, beam = body.beam_search_params(max_tokens)
            if tools.keeps_special_tokens:
                beam = dataclasses.replace(beam, skip_special_tokens=False)
            num_candidates(beam, ctx.engine.tokenizer.eos_token_ids)  # n fits: a 400 now
        else:
            params = body.sampling_params(max_tokens, defaults)
        params = ctx.thinking_budget(params, body.thinking_token_budget)
        if tools.json_schema is not None:
            params = dataclasses.replace(params, json_schema=tools.json_schema)
        if tools.keeps_special_tokens:
            params = dataclasses.replace(params, skip_special_tokens=False)
        schema_param = "tools" if tools.json_schema is not None else body.constraint_param()
        request = processor.request(
            new_id("chatcmpl"), prompt, params, body.priority, body.timeout, schema_param
        )
        return cls(ctx, body, request, tools, beam)

    def output_parser(self) -> ChatOutputParser:
        """A parser of one choice's text."""
        reasoning = reasoning_parser(self.reasoning) if self.reasoning else None
        tools = self.tools.new_parser() if self.tools.new_parser else None
        return ChatOutputParser(reasoning, tools, self.tools.max_calls)

    async def whole(self) -> dict[str, Any]:
        if self.beam is not None:
            [finals] = await beam_finals(self.ctx, [self.request], self.beam)
        else:
            [finals] = await self.ctx.run_to_end([self.request])
        choices = []
        for final in finals:
            parser = self.output_parser()
            message = parser.parse(final.text)
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
        body = completion_body(
            "chat.completion",
            self.id,
            self.ctx.model_name,
            choices,
            usage(self.prompt_tokens, generated),
        )
        return self._with_prompt_extras(body, finals[0].prompt_logprobs if finals else None)

    async def chunks(self) -> AsyncIterator[Chunk]:
        if self.beam is not None:
            outputs = beam_outputs(self.ctx, self.request, self.beam)
        else:
            outputs = self.ctx.outputs(self.request)
        # The role chunks wait for the engine's first output (as vLLM's do): until
        # then the request may still be refused, and respond() holds the status line.
        first = await anext(outputs)
        generated = 0
        for index in range(self.n):
            role = {"role": "assistant", "content": ""}
            choice = {"index": index, "delta": role, "finish_reason": None}
            chunk = self._chunk([choice], self._usage_so_far(generated))
            yield self._with_prompt_extras(chunk, first.prompt_logprobs) if index == 0 else chunk
        # Per choice: output tokens (and logprob entries) whose chunk is still to come.
        pending: list[tuple[list[int], list[dict[int, float]]]] = [([], []) for _ in range(self.n)]
        parsers = [self.output_parser() for _ in range(self.n)]
        async for out in prepend(first, outputs):  # deltas
            generated += len(out.delta_token_ids)
            parser = parsers[out.index]
            pending[out.index][0].extend(out.token_ids)
            if self.formatter is not None:
                pending[out.index][1].extend(out.logprobs or [])
            delta = parser.feed(out.delta_text) if out.delta_text else MessageDelta()
            if out.finished:
                delta.add(parser.finish())
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
            yield self._chunk([], usage(self.prompt_tokens, generated))

    def _message(self, message: MessageDelta) -> dict[str, Any]:
        body: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls or message.reasoning:
            body["content"] = message.content or None  # (OpenAI's null beside calls)
        if message.tool_calls:
            body["tool_calls"] = tool_calls_body(message.tool_calls)
        if self.reasoning:
            body["reasoning_content"] = message.reasoning or None
        return body

    def _with_prompt_extras(
        self, body: dict[str, Any], prompt_logprobs: list[dict[int, float] | None] | None
    ) -> dict[str, Any]:
        """vLLM's extras of the prompt, in the answer (a stream's first chunk): the ids
        return_token_ids asks for, and prompt_logprobs."""
        if self.token_ids:
            body["prompt_token_ids"] = self.request.prompt_token_ids
        if self.prompt_formatter is not None and prompt_logprobs is not None:
            body["prompt_logprobs"] = self.prompt_formatter.prompt(prompt_logprobs)
        return body

    def _usage_so_far(self, generated: int) -> dict[str, int] | None:
        """With continuous usage stats, the usage a content chunk carries."""
        return usage(self.prompt_tokens, generated) if self.continuous_usage else None

    def _logprobs(
        self, token_ids: list[int], entries: list[dict[int, float]] | None
    ) -> dict[str, Any] | None:
        """Chat logprobs of these output tokens; None unless asked."""
        if self.formatter is None:
            return None
        assert entries is not None
        return self.formatter.chat(token_ids, entries, self.top_logprobs)

    def _chunk(
        self, choices: list[dict[str, Any]], usage_value: dict[str, int] | None = None
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
