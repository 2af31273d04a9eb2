"""OpenAI request bodies (pydantic, so the app's OpenAPI schema describes them), and
their mapping to SamplingParams.

Requests accept OpenAI's fields and vLLM's extras (top_k, min_p, ignore_eos, min_tokens,
stop_token_ids, include_stop_str_in_output, repetition_penalty, priority), and this
server's own time limit (timeout).
A field we do not implement yet is refused with a 400 naming it rather than
ignored: a client must never get silently different behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from hetero_infer.engine.sampling_params import MAX_LOGPROBS, MAX_N, SamplingParams
from hetero_infer.server.errors import APIError
from pydantic import BaseModel, ConfigDict, Field, field_validator

INT64_MAX = 2**63 - 1


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields both completion routes share."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    # Bounded to int64: the sampler makes tensors and generators of them, and an
    # overflow there would kill the engine loop for every request.
    top_k: int | None = Field(default=None, ge=-1, le=INT64_MAX)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = Field(default=None, ge=0, le=INT64_MAX)
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    min_tokens: int = Field(default=0, ge=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    # vLLM's v1 engine has no best_of either: only 1 is accepted.
    best_of: int | None = None
    # Accepted at their neutral values only, until they are implemented.
    response_format: dict[str, Any] | None = None
    # vLLM's: with --scheduling-policy priority, lower values are served first (and
    # preempt running requests of higher values); any other value needs that policy.
    priority: int = 0
    # This server's own (vLLM, TGI and OpenAI have no such field): seconds the request
    # may take from its arrival, queueing included; it can shorten --request-timeout.
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def unsupported(self) -> None:
        """Raise a 400 for any field set to something we cannot honour."""
        if self.best_of not in (None, 1):
            raise APIError(
                400,
                "'best_of' greater than 1 is not supported (nor by vLLM's v1 engine); "
                "use 'n' for several choices",
                param="best_of",
            )

    def json_schema(self) -> dict[str, Any] | None:
        """response_format as a JSON schema to constrain decoding to, or None for text."""
        fmt = self.response_format
        if fmt is None or fmt.get("type") == "text":
            return None
        if fmt.get("type") == "json_object":
            return {"type": "object"}
        if fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise APIError(
                    400,
                    "response_format: json_schema needs {'name': ..., 'schema': {...}}",
                    param="response_format",
                )
            return schema
        raise APIError(
            400,
            "response_format: type must be 'text', 'json_object' or 'json_schema'",
            param="response_format",
        )

    def logprobs_params(self) -> dict[str, int]:
        """SamplingParams' logprobs / prompt_logprobs, from each route's own fields."""
        return {}

    def sampling_params(
        self, max_tokens: int, defaults: Mapping[str, Any] | None = None
    ) -> SamplingParams:
        """The body's SamplingParams (which check their own ranges); what needs the
        model (token ids, the schema) the engine's input processor checks. ``defaults``
        (the model's generation config) fill the sampling fields the body leaves out."""
        self.unsupported()
        values: dict[str, Any] = dict(defaults or {})
        values |= {
            "n": self.n,
            "max_tokens": max_tokens,
            "ignore_eos": self.ignore_eos,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "min_tokens": self.min_tokens,
        }
        names = (
            "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
            "presence_penalty", "frequency_penalty", "repetition_penalty",
        )  # fmt: skip
        for name in names:
            value = getattr(self, name)
            if value is not None:
                values[name] = value
        if self.logit_bias:
            values["logit_bias"] = _token_bias(self.logit_bias)
        values.update(self.logprobs_params())
        values["json_schema"] = self.json_schema()
        return SamplingParams(**values)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    suffix: str | None = None
    # OpenAI caps this at 5; vLLM's default max_logprobs is 20.
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def logprobs_params(self) -> dict[str, int]:
        if self.logprobs is None:
            return {}
        values = {"logprobs": self.logprobs}
        if self.echo:
            values["prompt_logprobs"] = self.logprobs
        return values

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be empty")
        for text in [value] if isinstance(value, str) else value:
            if isinstance(text, str):
                _check_text(text)
        return value

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _valid_text(cls, value: Any) -> Any:
        parts = value if isinstance(value, list) else [{"text": value}]
        for part in parts:
            if isinstance(part.get("text"), str):
                _check_text(part["text"])
        return value

    def text(self) -> str:
        """String content, or the text parts of list content joined."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(
                    400, "only text content parts are supported", param="messages.content"
                )
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def logprobs_params(self) -> dict[str, int]:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(
                400, "logprobs must be set to true if top_logprobs is used", param="top_logprobs"
            )
        return {"logprobs": self.top_logprobs or 0} if self.logprobs else {}

    def template_messages(self) -> list[dict[str, str]]:
        if self.tools:
            raise APIError(400, "'tools' is not supported by this server yet", param="tools")
        return template_messages(self.messages)


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True

    @field_validator("prompt")
    @classmethod
    def _valid_text(cls, value: str | None) -> str | None:
        return value if value is None else _check_text(value)


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]


def _token_bias(logit_bias: dict[str, float]) -> dict[int, float]:
    """OpenAI sends token ids as JSON object keys, so as strings."""
    bias = {}
    for key, value in logit_bias.items():
        try:
            token_id = int(key)
        except ValueError:
            raise APIError(
                400, f"logit_bias: key {key!r} is not a token id", param="logit_bias"
            ) from None
        bias[token_id] = value
    return bias


def _check_text(text: str) -> str:
    """JSON can carry lone surrogates ("\\ud800"): no tokenizer takes them, so refuse here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (it has a lone surrogate)") from None
    return text


def template_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Messages as the chat template takes them: role and text content."""
    return [{"role": m.role, "content": m.text()} for m in messages]
