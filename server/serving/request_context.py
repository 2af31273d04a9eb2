"""RequestContext: one HTTP request's way to the engine.

It checks the model name and that the engine takes requests, runs engine requests with
their outputs observed by the metrics, and, for answers sent whole, aborts them when the
client goes away (streams abort when the SSE response stops iterating them).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from hetero_infer.engine.entrypoints.async_engine import AsyncEngine
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.frontend.input_processor import EngineRequest, PromptTokens
from hetero_infer.engine.lora import LoRARequest
from hetero_infer.engine.params.sampling_params import RequestOutputKind, SamplingParams
from hetero_infer.engine.params.thinking_budget import ThinkingBudget
from hetero_infer.engine.settings.exceptions import EngineError, ValidationError
from hetero_infer.server.errors import APIError
from hetero_infer.server.request_tracker import RequestTracker
from hetero_infer.server.server_metrics import ServerMetrics
from hetero_infer.server.serving.reasoning import THINK_END, THINK_START
from hetero_infer.server.serving.tool_prompt import with_tool_prompt
from hetero_infer.server.settings import ServerSettings

T = TypeVar("T")


# An unknown model name is echoed in the 404 up to this many characters: a body may
# send megabytes of name.
MAX_ECHOED_NAME = 256


def echoed(name: str) -> str:
    """A model name as an error message repeats it: cut at MAX_ECHOED_NAME."""
    return name if len(name) <= MAX_ECHOED_NAME else name[:MAX_ECHOED_NAME] + "..."


def check_model(settings: ServerSettings, model: str | None) -> None:
    """404 for a model name the server does not answer to (None: any)."""
    if model is not None and model not in settings.model_names:
        raise unknown_model(model)


def unknown_model(model: str) -> APIError:
    """The 404 for a model name the server does not answer to."""
    return APIError(
        404,
        f"The model `{echoed(model)}` does not exist.",
        "not_found_error",
        param="model",
        code="model_not_found",
    )


@dataclass(frozen=True)
class RequestContext:
    engine: AsyncEngine
    metrics: ServerMetrics
    model_name: str  # the name responses report
    connection: Request
    settings: ServerSettings
    # The LoRA adapter ``model`` names (loaded through server/openai/lora.py's routes),
    # None for the base model.
    lora: LoRARequest | None = None

    @classmethod
    def open(cls, request: Request, model: str | None) -> RequestContext:
        """The context of a request naming ``model`` (the base model's name or a loaded
        LoRA adapter's): 404 for a model not served, 503 while the engine cannot take
        requests."""
        state = request.app.state.server
        lora = _adapter(state.engine, model)
        if lora is None:
            check_model(state.settings, model)
        engine = state.require_engine()
        name = state.settings.model_name if lora is None else lora.name
        return cls(engine, state.metrics, name, request, state.settings, lora)

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """The token ids of ``messages`` through the chat template (the server's
        --chat-template, else the tokenizer's); ``tools`` through it too, or, where it
        renders none, in a generic tool prompt (tool_prompt.py). What the template (or
        transformers around it) refuses is the caller's input: a 400 naming messages."""
        tokenizer = self.engine.tokenizer
        template = self.settings.chat_template_text
        if tools and not tokenizer.renders_tools(template):
            messages = with_tool_prompt(messages, tools, self.settings.tool_call_parser)
            tools = None
        try:
            return tokenizer.apply_chat_template(
                messages,
                add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                chat_template=template,
                template_kwargs=template_kwargs,
                add_special_tokens=add_special_tokens,
            )
        except ValidationError as exc:
            raise APIError.from_exception(exc) from exc
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from exc

    def thinking_budget(self, params: SamplingParams, budget: int | None) -> SamplingParams:
        """``params`` with vLLM's thinking_token_budget: the reasoning parser names the
        thinking marks, so without one the budget is a 400."""
        if budget is None:
            return params
        if self.settings.reasoning_parser is None:
            raise APIError(
                400,
                "thinking_token_budget needs a reasoning parser (--reasoning-parser), "
                "which names the marks that open and close the thinking",
                param="thinking_token_budget",
            )
        marked = ThinkingBudget.for_marks(budget, THINK_START, THINK_END, self.engine.tokenizer)
        return dataclasses.replace(params, thinking_budget=marked)

    async def outputs(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one request, observed by the metrics; the engine's
        errors as APIErrors (which a stream reports in-band)."""
        if self.lora is not None and request.lora is None:
            request = dataclasses.replace(request, lora=self.lora)
        params = request.params
        tracker = RequestTracker(self.metrics, params.output_kind is RequestOutputKind.FINAL_ONLY)
        try:
            async for output in self.engine.generate(request):
                tracker.observe(output)
                yield output
        except (EngineError, ValueError) as exc:
            raise APIError.from_exception(exc) from exc
        except (asyncio.CancelledError, GeneratorExit):
            # Its client went away, or a sibling request failed (run_to_end).
            tracker.abandoned(len(request.prompt_token_ids), params.n, params.max_tokens)
            raise
        tracker.done(params.max_tokens, params.n)

    def max_tokens(self, prompt: PromptTokens, requested: int | None) -> int:
        """A request's max_tokens for ``prompt``: its own, which must fit the context with
        the prompt (OpenAI's rule); without one, the model's default (its generation
        config's max_new_tokens) cut to what the context has left; without that, all
        the context has left."""
        processor = self.engine.input_processor
        default = self.engine.generation_defaults.max_tokens
        if requested is not None or default is None:
            return processor.fit_context(prompt, requested)
        return min(default, processor.fit_context(prompt, None))

    async def until_disconnect(self, work: Awaitable[T]) -> T:
        """Await ``work``; if the client goes away first, cancel it (which aborts its
        requests) and raise a 499."""
        return await _until_disconnect(self.connection, work)

    async def run_to_end(self, requests: list[EngineRequest]) -> list[list[RequestOutput]]:
        """Run the requests concurrently; each one's finished outputs, one per choice in
        choice order. A client that goes away aborts them all, and so does one of them
        failing (a 503 for the third prompt leaves no use for the first two). If they ran
        out of time before any token, there is no answer to give: a 408."""
        runs = [asyncio.ensure_future(_collect(self.outputs(r))) for r in requests]
        try:
            results = await self.until_disconnect(asyncio.gather(*runs))
        except BaseException:
            for run in runs:
                run.cancel()  # unwinds into AsyncEngine.generate, which aborts the request
            raise
        finals = [_finals(outputs) for outputs in results]
        # A client that stays to read its answer sees "abort" only from a time limit.
        choices = [out for outs in finals for out in outs]
        if choices and all(o.finish_reason == "abort" and not o.token_ids for o in choices):
            raise timed_out_before_first_token()
        return finals


def _adapter(engine: AsyncEngine | None, model: str | None) -> LoRARequest | None:
    """The loaded adapter a request's ``model`` names, or None."""
    if model is None or engine is None or engine.lora is None:
        return None
    return engine.lora.resolve(model)


def timed_out_before_first_token() -> APIError:
    """A 408: a request whose time limit ended before it had a token to give."""
    return APIError(
        408,
        "the request ran past its time limit (its timeout, or the server's "
        "--request-timeout) before its first token",
        "timeout_error",
        code="request_timeout",
    )


async def _collect(outputs: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    return [out async for out in outputs]


def _finals(outputs: list[RequestOutput]) -> list[RequestOutput]:
    """The finished output of each choice, in choice order."""
    return sorted((o for o in outputs if o.finished), key=lambda o: o.index)


async def _until_disconnect(connection: Request, work: Awaitable[T]) -> T:
    """Await ``work``; cancel it (so its requests are aborted) if the client disconnects."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(connection))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()  # unwinds into AsyncEngine.generate, which aborts the request
        await asyncio.gather(task, return_exceptions=True)
        raise APIError(499, "client closed the request", "client_closed_request")
    return task.result()


async def _disconnected(connection: Request) -> None:
    """Returns once the client has disconnected.

    It waits on receive() for the disconnect: request.is_disconnected() never sees one
    behind the @app.middleware("http") guard, whose receive wrapper drops the message
    under the already-cancelled scope is_disconnected() polls with.
    """
    while (await connection.receive())["type"] != "http.disconnect":
        pass
