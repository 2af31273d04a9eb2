"""An Ollama body's engine request: its sampling fields through the serving layer's
(serving/sampling_fields.py: checks, the model's generation defaults, ``format`` as
response_format), and its output limit as Ollama sets it.

num_predict is clamped to what the context leaves after the prompt (Ollama stops
there too; /v1 refuses such a request); a prompt that fills the context is a 400.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from hetero_infer.engine.frontend.input_processor import EngineRequest, PromptTokens
from hetero_infer.server.errors import APIError
from hetero_infer.server.ollama.options import SAMPLING_FIELDS, option_name
from hetero_infer.server.ollama.request_bodies import GenerationBody
from hetero_infer.server.serving.answer_parts import new_id
from hetero_infer.server.serving.request_context import RequestContext
from hetero_infer.server.serving.sampling_fields import SamplingFields
from pydantic import ValidationError as PydanticValidationError

F = TypeVar("F", bound=SamplingFields)


def sampling_values(body: GenerationBody) -> dict[str, Any]:
    """The sampling fields an Ollama body sets, under SamplingFields' names (OpenAI's
    and vLLM's)."""
    fields = body.checked_options.sampling_fields()
    fields.update(stream=body.stream, response_format=body.response_format())
    return fields


def validated(model: type[F], data: dict[str, Any]) -> F:
    """``data`` as the serving layer's body ``model``; its errors name the Ollama field
    they came from."""
    try:
        return model.model_validate(data)
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        loc = [str(part) for part in first.get("loc", ())]
        if loc and loc[0] in SAMPLING_FIELDS.values():
            loc = ["options", option_name(loc[0]), *loc[1:]]
        param = ".".join(loc) or None
        message = first.get("msg", "invalid request")
        raise APIError(400, f"{param}: {message}" if param else message, param=param) from None


def engine_request(
    ctx: RequestContext,
    body: GenerationBody,
    fields: SamplingFields,
    prompt: PromptTokens,
    keep_special_tokens: bool = False,
) -> EngineRequest:
    """``keep_special_tokens``: a tool parser's markers are special tokens."""
    processor = ctx.engine.input_processor
    left = processor.fit_context(prompt, None)  # a 400 if the prompt fills the context
    requested = body.checked_options.max_tokens()
    max_tokens = min(requested, left) if requested else ctx.max_tokens(prompt, None)
    params = fields.sampling_params(max_tokens, ctx.engine.generation_defaults.sampling)
    logprobs = body.top_logprobs_count()
    if logprobs is not None:
        params = dataclasses.replace(params, logprobs=logprobs)
    if keep_special_tokens:
        params = dataclasses.replace(params, skip_special_tokens=False)
    return processor.request(new_id("ollama"), prompt, params, schema_param="format")
