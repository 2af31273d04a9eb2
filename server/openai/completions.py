"""/v1/completions: the body's prompts become engine requests, their outputs a
completion or a stream of chunks.

Choices are numbered ``prompt_index * n + choice``. With echo the prompt comes before
the completion (token-id prompts as their decode) and, with logprobs, the prompt
tokens' logprobs first. Streamed prompts run one after another. With continuous usage
stats every chunk's usage counts all the request's prompts and the tokens generated so
far, so the last one equals the final usage chunk.

With use_beam_search each prompt is searched (engine/entrypoints/beam_search.py) and its n beams
come back as its choices, best first; a stream sends each beam whole once its search
ends, as vLLM does. ``beam_outputs`` and ``beam_finals`` serve chat.py too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from hetero_infer.engine.entrypoints.beam_search import BeamSearchParams, num_candidates
from hetero_infer.engine.entrypoints.beam_search_runner import beam_search_async
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.frontend.input_processor import EngineRequest
from hetero_infer.engine.settings.exceptions import EngineError
from hetero_infer.engine.tokenizer import Tokenizer
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.completion_request import CompletionRequest
from hetero_infer.server.openai.responses import Chunk, completion_body, usage
from hetero_infer.server.request_tracker import RequestTracker
from hetero_infer.server.serving.answer_parts import new_id
from hetero_infer.server.serving.logprobs import Entry, LogprobsFormatter
from hetero_infer.server.serving.request_context import RequestContext, timed_out_before_first_token


@dataclass
class _ChoiceCursor:
    """How far a streamed choice has got."""

    started: bool = False  # its first chunk (with the echo) is out
    text_offset: int = 0  # text_offset of the next logprobs entry
    # Output tokens (and their logprob entries) whose chunk is still to come: a token
    # without text yet rides on a later chunk. The stream's outputs are deltas.
    pending_ids: list[int] = field(default_factory=list)
    pending_entries: list[Entry] = field(default_factory=list)
    prompt_logprobs: list[Entry | None] | None = None  # from the first output


class Completion:
    """One /v1/completions request: an engine request per prompt, and the answer."""

    def __init__(
        self,
        ctx: RequestContext,
        body: CompletionRequest,
        completion_id: str,
        requests: list[EngineRequest],
        beam: BeamSearchParams | None = None,
    ) -> None:
        """``beam``: the search's params, for use_beam_search."""
        self.ctx = ctx
        self.beam = beam
        self.id = completion_id
        self.requests = requests
        self.n = requests[0].params.n
        self.echo = body.echo
        self.include_usage = body.include_usage
        self.continuous_usage = body.continuous_usage
        tokenizer = ctx.engine.tokenizer
        self.echoed = [_echo_text(r, tokenizer) if body.echo else "" for r in requests]
        as_ids = bool(body.return_tokens_as_token_ids)
        self.formatter = LogprobsFormatter(tokenizer, as_ids) if body.logprobs is not None else None
        self.prompt_formatter = None  # vLLM's prompt_logprobs
        if body.prompt_logprobs is not None:
            self.prompt_formatter = self.formatter or LogprobsFormatter(tokenizer, as_ids)
        self.token_ids = bool(body.return_token_ids)
        self.prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
        # Each prompt's tokens the prefix cache held, from its choice 0's outputs.
        self.cached_tokens = [0] * len(requests)

    @classmethod
    def build(cls, ctx: RequestContext, body: CompletionRequest) -> Completion:
        """Tokenize and check every prompt, then its params: each prompt's max_tokens
        fits its own context, as in vLLM (without one asked for, a short prompt may run
        longer than a long one); a beam search takes the least for all."""
        if body.suffix:
            raise APIError(400, "'suffix' is not supported", param="suffix")
        processor = ctx.engine.input_processor
        defaults = ctx.engine.generation_defaults
        special = body.add_special_tokens
        prompts = [
            body.truncated(processor.tokenize(p, add_special_tokens=special), processor)
            for p in body.prompts()
        ]
        requested = body.max_tokens
        if "max_tokens" not in body.model_fields_set and defaults.max_tokens is not None:
            requested = None  # OpenAI's default of 16 gives way to the model's own
        limits = [ctx.max_tokens(prompt, requested) for prompt in prompts]
        beam = None
        if body.use_beam_search:
            # Each prompt's search goes as far as its own limit (beam_outputs).
            params, beam = body.beam_search_params(min(limits))
            num_candidates(beam, ctx.engine.tokenizer.eos_token_ids)  # n fits: a 400 now
        else:
            params = body.sampling_params(min(limits), defaults.sampling)
        params = ctx.thinking_budget(params, body.thinking_token_budget)
        engine_id = new_id("cmpl")
        constraint = body.constraint_param()
        requests = [
            processor.request(
                f"{engine_id}-{i}",
                prompt,
                replace(params, max_tokens=limit),  # checked at the least
                body.priority,
                body.timeout,
                constraint,
            )
            for i, (prompt, limit) in enumerate(zip(prompts, limits, strict=True))
        ]
        return cls(ctx, body, body.answer_id(engine_id, "cmpl"), requests, beam)

    async def whole(self) -> dict[str, Any]:
        if self.beam is not None:
            finals = await beam_finals(self.ctx, self.requests, self.beam)
        else:
            finals = await self.ctx.run_to_end(self.requests)
        choices = []
        for i, outs in enumerate(finals):
            for out in outs:
                logprobs = None
                if self.formatter is not None:
                    assert out.logprobs is not None
                    ids, entries = list(out.token_ids), list(out.logprobs)
                    if self.echo:
                        ids, entries = self._with_prompt(i, out.prompt_logprobs, ids, entries)
                    logprobs = self.formatter.completion(ids, entries, 0)
                choice = self._choice(i, out, self.echoed[i] + out.text, logprobs)
                choices.append(
                    self._with_extras(choice, i, out.token_ids, True, out.prompt_logprobs)
                )
        generated = sum(len(out.token_ids) for outs in finals for out in outs)
        self.cached_tokens = [outs[0].num_cached_tokens if outs else 0 for outs in finals]
        return self._body(choices, self._usage(generated))

    async def chunks(self) -> AsyncIterator[Chunk]:
        generated = 0
        for i, request in enumerate(self.requests):
            cursors = [_ChoiceCursor() for _ in range(self.n)]
            if self.beam is not None:
                outputs = beam_outputs(self.ctx, request, self.beam)
            else:
                outputs = self.ctx.outputs(request)
            async for out in outputs:
                generated += len(out.delta_token_ids)
                if out.index == 0:
                    self.cached_tokens[i] = out.num_cached_tokens
                chunk = self._chunk(i, out, cursors[out.index], generated)
                if chunk is not None:
                    yield chunk
        if self.include_usage:
            yield self._body([], self._usage(generated))

    def _usage(self, generated: int) -> dict[str, Any]:
        """The usage so far; with prompt tokens details on, the prompts' cached tokens."""
        details = self.ctx.settings.enable_prompt_tokens_details
        cached = sum(self.cached_tokens) if details else None
        return usage(self.prompt_tokens, generated, cached)

    def _chunk(
        self, i: int, out: RequestOutput, cursor: _ChoiceCursor, generated: int
    ) -> Chunk | None:
        """The chunk for prompt ``i``'s output (a delta), None while it has no text to
        send (the logprobs of tokens without text yet ride on a later chunk).
        ``generated``: the request's tokens so far, for continuous usage stats."""
        first = not cursor.started
        if first and out.prompt_logprobs is not None:
            cursor.prompt_logprobs = out.prompt_logprobs
        cursor.pending_ids += out.token_ids
        if self.formatter is not None:
            assert out.logprobs is not None
            cursor.pending_entries += out.logprobs
        if not (out.delta_text or out.finished or first and self.echo):
            return None
        text = (self.echoed[i] if first else "") + out.delta_text
        logprobs = None
        new_ids = cursor.pending_ids
        if self.formatter is not None:
            ids, entries = new_ids, cursor.pending_entries
            if first and self.echo:
                ids, entries = self._with_prompt(i, cursor.prompt_logprobs, ids, entries)
            logprobs = self.formatter.completion(ids, entries, cursor.text_offset)
            cursor.text_offset += self.formatter.text_length(ids)
        cursor.pending_ids, cursor.pending_entries = [], []
        cursor.started = True
        running_usage = self._usage(generated) if self.continuous_usage else None
        choice = self._choice(i, out, text, logprobs)
        choice = self._with_extras(choice, i, new_ids, first, cursor.prompt_logprobs)
        return self._body([choice], running_usage)

    def _with_prompt(
        self,
        i: int,
        prompt_logprobs: list[Entry | None] | None,
        ids: list[int],
        entries: list[Entry],
    ) -> tuple[list[int], list[Entry | None]]:
        """Echo with logprobs: prompt ``i``'s tokens and their logprobs first."""
        assert prompt_logprobs is not None
        return self.requests[i].prompt_token_ids + ids, [*prompt_logprobs, *entries]

    def _choice(
        self, i: int, out: RequestOutput, text: str, logprobs: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {
            "index": i * self.n + out.index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": out.finish_reason,
            "stop_reason": out.stop_reason,
        }

    def _with_extras(
        self,
        choice: dict[str, Any],
        i: int,
        token_ids: list[int],
        first: bool,
        prompt_logprobs: list[Entry | None] | None,
    ) -> dict[str, Any]:
        """vLLM's extras of a choice, or of a chunk of it: return_token_ids' ids of
        prompt ``i`` (in a choice's first chunk only) and the choice's (a chunk's own),
        and prompt_logprobs (first chunk only)."""
        if self.token_ids:
            choice["prompt_token_ids"] = self.requests[i].prompt_token_ids if first else None
            choice["token_ids"] = list(token_ids)
        if self.prompt_formatter is not None:
            shown = self.prompt_formatter.prompt(prompt_logprobs) if first else None
            choice["prompt_logprobs"] = shown
        return choice

    def _body(
        self, choices: list[dict[str, Any]], usage_value: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return completion_body(
            "text_completion", self.id, self.ctx.model_name, choices, usage_value
        )


async def beam_outputs(
    ctx: RequestContext, request: EngineRequest, params: BeamSearchParams
) -> AsyncIterator[RequestOutput]:
    """The beams of one request's search, best first, once it has ended (each whole,
    its delta fields too), observed by the metrics; the engine's errors as APIErrors.
    A search that ran out of time before its first token has no beam to give: a 408.
    Its max_tokens is the request's (a prompt's own room, where several share ``params``)."""
    params = replace(params, max_tokens=request.params.max_tokens)
    tracker = RequestTracker(ctx.metrics, final_only=True)
    try:
        outputs = await beam_search_async(ctx.engine, request, params)
    except (EngineError, ValueError) as exc:
        raise APIError.from_exception(exc) from exc
    except asyncio.CancelledError:  # its client went away
        tracker.abandoned(len(request.prompt_token_ids), params.beam_width, params.max_tokens)
        raise
    if not outputs:
        raise timed_out_before_first_token()
    for output in outputs:
        tracker.observe(output)
        yield output
    tracker.done(params.max_tokens, params.beam_width)


async def beam_finals(
    ctx: RequestContext, requests: list[EngineRequest], params: BeamSearchParams
) -> list[list[RequestOutput]]:
    """RequestContext.run_to_end for beam searches: each request's beams, searched
    concurrently; a client that leaves, or one search failing, cancels them all (which
    aborts their rounds' requests)."""
    runs = [asyncio.ensure_future(_collect(beam_outputs(ctx, r, params))) for r in requests]
    try:
        return await ctx.until_disconnect(asyncio.gather(*runs))
    except BaseException:
        for run in runs:
            run.cancel()
        raise


async def _collect(outputs: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    return [output async for output in outputs]


def _echo_text(request: EngineRequest, tokenizer: Tokenizer) -> str:
    """The prompt as it was sent; a token-id prompt as its decode."""
    if request.prompt is not None:
        return request.prompt
    return tokenizer.decode(request.prompt_token_ids)
