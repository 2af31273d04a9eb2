"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models,
/tokenize and /detokenize.

A request is validated and tokenized here, then runs through the AsyncEngine.
Streams are SSE (``data: {chunk}`` ... ``data: [DONE]``). A client that goes away
aborts its request, streaming or not, so its KV blocks return at once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from hetero_infer.engine.async_engine import AsyncEngine
from hetero_infer.engine.exceptions import EngineError
from hetero_infer.engine.outputs import RequestOutput
from hetero_infer.engine.sampling_params import SamplingParams
from hetero_infer.server.errors import APIError
from hetero_infer.server.logprobs import LogprobsFormatter, text_length
from hetero_infer.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    new_id,
    now,
    usage,
)
from sse_starlette.sse import EventSourceResponse

logger = logging.getLogger(__name__)
router = APIRouter()
T = TypeVar("T")


def _state(request: Request):
    return request.app.state.server


def _check_model(request: Request, model: str | None) -> None:
    if model is not None and model not in _state(request).settings.model_names:
        raise APIError(
            404,
            f"The model `{model}` does not exist.",
            "not_found_error",
            param="model",
            code="model_not_found",
        )


def _check_length(engine: AsyncEngine, token_ids: list[int], max_tokens: int | None) -> int:
    """The max_tokens to use; 400 when the prompt (plus max_tokens) overflows the context."""
    limit = engine.engine.max_model_len
    if len(token_ids) + (max_tokens or 0) > limit or len(token_ids) >= limit:
        asked = f"{len(token_ids)} in the messages/prompt"
        if max_tokens:
            asked += f" and {max_tokens} for the completion"
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{len(token_ids) + (max_tokens or 0)} tokens ({asked}). "
            "Please reduce the length of the messages or completion.",
            param="messages" if max_tokens is None else "max_tokens",
            code="context_length_exceeded",
        )
    return max_tokens or limit - len(token_ids)


def _sampling_params(
    engine: AsyncEngine, body: CompletionRequest | ChatCompletionRequest, max_tokens: int
) -> SamplingParams:
    """The request's SamplingParams, checked against the model here so that a bad one
    is a 400 even when streaming (where errors after the first byte go in-band)."""
    params = body.sampling_params(max_tokens, engine.engine.model_config.vocab_size)
    try:
        engine.engine.input_processor.check_params(params)
    except ValueError as exc:
        raise APIError.from_exception(exc) from exc
    return params


def _tokenize_prompt(engine: AsyncEngine, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "prompt must not be empty", param="prompt")
        return engine.engine.tokenizer.encode(prompt)
    vocab = engine.engine.model_config.vocab_size
    if not prompt or any(not 0 <= t < vocab for t in prompt):
        raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
    return list(prompt)


async def _run(
    request: Request, engine: AsyncEngine, token_ids: list[int], params: SamplingParams, rid: str
) -> AsyncIterator[RequestOutput]:
    """The engine's outputs for one request, observed by the metrics."""
    tracker = _state(request).metrics.tracker()
    try:
        async for output in engine.generate(token_ids, params, rid):
            tracker.observe(output)
            yield output
    except (EngineError, ValueError) as exc:
        raise APIError.from_exception(exc) from exc


async def _until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; cancel it (so its requests are aborted) if the client disconnects.

    It waits on receive() for the disconnect: request.is_disconnected() never sees one
    behind the @app.middleware("http") guard, whose receive wrapper drops the message
    under the already-cancelled scope is_disconnected() polls with.
    """

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
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


async def _collect(outputs: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    return [out async for out in outputs]


async def _run_all(
    request: Request,
    engine: AsyncEngine,
    prompts: list[list[int]],
    params: SamplingParams,
    base_id: str,
) -> list[list[RequestOutput]]:
    """Run several prompts concurrently; return each one's final outputs, one per choice."""
    streams = [
        _collect(_run(request, engine, ids, params, f"{base_id}-{i}"))
        for i, ids in enumerate(prompts)
    ]
    results = await _until_disconnect(request, asyncio.gather(*streams))
    return [_finals(outs) for outs in results]


def _finals(outputs: list[RequestOutput]) -> list[RequestOutput]:
    """The finished output of each choice, in choice order."""
    return sorted((o for o in outputs if o.finished), key=lambda o: o.index)


def _sse(chunks: AsyncIterator[dict[str, Any]]) -> EventSourceResponse:
    async def events() -> AsyncIterator[dict[str, str]]:
        try:
            async for chunk in chunks:
                yield {"data": json.dumps(chunk, ensure_ascii=False)}
        except APIError as exc:
            # The status line has gone out already: report in-band, then end.
            yield {"event": "error", "data": json.dumps(exc.body())}
        yield {"data": "[DONE]"}

    return EventSourceResponse(events(), ping=0, sep="\n")


def _completion_object(
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


# ---- /v1/completions ----


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    state = _state(request)
    _check_model(request, body.model)
    engine = state.require_engine()
    if body.suffix:
        raise APIError(400, "'suffix' is not supported", param="suffix")
    tokenizer = engine.engine.tokenizer
    prompts_given = body.prompts()
    prompts = [_tokenize_prompt(engine, p) for p in prompts_given]
    max_tokens = [_check_length(engine, ids, body.max_tokens) for ids in prompts]
    params = _sampling_params(engine, body, min(max_tokens))
    completion_id = new_id("cmpl")
    name = state.settings.model_name
    # echo returns the prompt as it was sent; token-id prompts as their decode.
    echoed = [
        (p if isinstance(p, str) else tokenizer.decode(ids)) if body.echo else ""
        for p, ids in zip(prompts_given, prompts, strict=True)
    ]
    formatter = LogprobsFormatter(tokenizer) if params.logprobs is not None else None

    def choice(
        index: int, text: str, out: RequestOutput, logprobs: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": out.finish_reason,
            "stop_reason": out.stop_reason,
        }

    def logprob_tokens(
        index: int, out: RequestOutput, start: int, with_prompt: bool
    ) -> tuple[list[int], list[Any]]:
        """Token ids and logprob entries from output token ``start`` on (prompt first)."""
        ids: list[int] = []
        entries: list[Any] = []
        if with_prompt:
            assert out.prompt_logprobs is not None
            ids += prompts[index]
            entries += out.prompt_logprobs
        assert out.logprobs is not None
        ids += out.token_ids[start:]
        entries += out.logprobs[start:]
        return ids, entries

    chunk = functools.partial(_completion_object, "text_completion", completion_id, name)
    prompt_tokens = sum(len(p) for p in prompts)
    n = params.n

    if not body.stream:
        finals = await _run_all(request, engine, prompts, params, completion_id)
        choices = []
        for i, outs in enumerate(finals):
            for out in outs:
                logprobs = None
                if formatter is not None:
                    logprobs = formatter.completion(*logprob_tokens(i, out, 0, body.echo), 0)
                choices.append(choice(i * n + out.index, echoed[i] + out.text, out, logprobs))
        generated = sum(len(o.token_ids) for outs in finals for o in outs)
        return JSONResponse(chunk(choices, usage(prompt_tokens, generated)))

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def stream() -> AsyncIterator[dict[str, Any]]:
        generated = 0
        for i, ids in enumerate(prompts):
            # Per choice: whether its first chunk is out, tokens sent, text offset.
            started: set[int] = set()
            sent_tokens = [0] * n
            offsets = [0] * n
            async for out in _run(request, engine, ids, params, f"{completion_id}-{i}"):
                generated += len(out.delta_token_ids)
                c = out.index
                first = c not in started
                if not (out.delta_text or out.finished or first and body.echo):
                    continue  # logprobs of tokens without text yet ride on a later chunk
                text = (echoed[i] if first else "") + out.delta_text
                logprobs = None
                if formatter is not None:
                    lp_ids, entries = logprob_tokens(i, out, sent_tokens[c], first and body.echo)
                    logprobs = formatter.completion(lp_ids, entries, offsets[c])
                    offsets[c] += text_length(formatter, lp_ids)
                    sent_tokens[c] = len(out.token_ids)
                started.add(c)
                yield chunk([choice(i * n + c, text, out, logprobs)])
        if include_usage:
            yield chunk([], usage(prompt_tokens, generated))

    return _sse(stream())


# ---- /v1/chat/completions ----


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = _state(request)
    _check_model(request, body.model)
    engine = state.require_engine()
    try:
        token_ids = engine.engine.tokenizer.apply_chat_template(body.template_messages())
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from exc
    requested = body.max_completion_tokens or body.max_tokens
    params = _sampling_params(engine, body, _check_length(engine, token_ids, requested))
    completion_id = new_id("chatcmpl")
    name = state.settings.model_name
    formatter = LogprobsFormatter(engine.engine.tokenizer) if body.logprobs else None
    top = body.top_logprobs or 0

    def logprobs(out: RequestOutput, start: int) -> dict[str, Any] | None:
        if formatter is None:
            return None
        assert out.logprobs is not None
        return formatter.chat(out.token_ids[start:], out.logprobs[start:], top)

    chunk = functools.partial(_completion_object, "chat.completion.chunk", completion_id, name)

    if not body.stream:
        outputs = await _until_disconnect(
            request, _collect(_run(request, engine, token_ids, params, completion_id))
        )
        finals = _finals(outputs)
        choices = [
            {
                "index": final.index,
                "message": {"role": "assistant", "content": final.text},
                "logprobs": logprobs(final, 0),
                "finish_reason": final.finish_reason,
                "stop_reason": final.stop_reason,
            }
            for final in finals
        ]
        generated = sum(len(final.token_ids) for final in finals)
        return JSONResponse(
            _completion_object(
                "chat.completion",
                completion_id,
                name,
                choices,
                usage(len(token_ids), generated),
            )
        )

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def stream() -> AsyncIterator[dict[str, Any]]:
        for c in range(params.n):
            role = {"role": "assistant", "content": ""}
            yield chunk([{"index": c, "delta": role, "finish_reason": None}])
        generated = 0
        sent_tokens = [0] * params.n
        async for out in _run(request, engine, token_ids, params, completion_id):
            generated += len(out.delta_token_ids)
            # Logprobs of tokens without text yet ride on a later chunk.
            if out.delta_text or out.finished:
                delta = {"content": out.delta_text} if out.delta_text else {}
                chunk_logprobs = logprobs(out, sent_tokens[out.index])
                sent_tokens[out.index] = len(out.token_ids)
                yield chunk(
                    [
                        {
                            "index": out.index,
                            "delta": delta,
                            "logprobs": chunk_logprobs,
                            "finish_reason": out.finish_reason,
                            "stop_reason": out.stop_reason,
                        }
                    ]
                )
        if include_usage:
            yield chunk([], usage(len(token_ids), generated))

    return _sse(stream())


# ---- models, tokenizer ----


@router.get("/v1/models")
async def models(request: Request):
    state = _state(request)
    max_len = state.engine.engine.max_model_len if state.engine else None
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": now(),
                "owned_by": "hetero-paged-infer",
                "root": state.settings.engine.model or state.settings.model_name,
                "max_model_len": max_len,
            }
            for name in state.settings.model_names
        ],
    }


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request):
    _check_model(request, body.model)
    engine = _state(request).require_engine()
    tokenizer = engine.engine.tokenizer
    if body.messages is not None:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        tokens = tokenizer.apply_chat_template(messages)
    elif body.prompt is not None:
        tokens = tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        raise APIError(400, "give 'prompt' or 'messages'", param="prompt")
    return {"tokens": tokens, "count": len(tokens), "max_model_len": engine.engine.max_model_len}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request):
    _check_model(request, body.model)
    engine = _state(request).require_engine()
    vocab = engine.engine.model_config.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
    return {"prompt": engine.engine.tokenizer.decode(body.tokens)}
