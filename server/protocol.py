"""OpenAI request and response bodies, and the mapping to SamplingParams.

Requests accept OpenAI's fields and vLLM's extras (top_k, min_p, ignore_eos).
A field we do not implement yet is refused with a 400 naming it rather than
ignored: a client must never get silently different behaviour.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.sampling_params import SamplingParams

INT64_MAX = 2**63 - 1


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status_code: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code or type
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


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
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Accepted at their neutral values only, until they are implemented.
    n: int = Field(default=1, ge=1, le=128)
    best_of: int | None = None
    stop: str | list[str] | None = None
    logprobs: Any = None
    top_logprobs: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> None:
        """Raise a 400 for any field set to something we cannot honour yet."""
        checks = {
            "n": self.n != 1,
            "best_of": self.best_of not in (None, 1),
            "stop": bool(self.stop),
            "logprobs": self.logprobs not in (None, False),
            "top_logprobs": self.top_logprobs not in (None, 0),
            "presence_penalty": self.presence_penalty != 0,
            "frequency_penalty": self.frequency_penalty != 0,
            "repetition_penalty": self.repetition_penalty not in (None, 1, 1.0),
            "logit_bias": bool(self.logit_bias),
            "response_format": bool(self.response_format)
            and self.response_format.get("type") != "text",
        }
        for name, is_set in checks.items():
            if is_set:
                raise APIError(400, f"'{name}' is not supported by this server yet", param=name)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        self.unsupported()
        values: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": self.ignore_eos}
        for name in ("temperature", "top_p", "top_k", "min_p", "seed"):
            value = getattr(self, name)
            if value is not None:
                values[name] = value
        try:
            return SamplingParams(**values)
        except ValueError as exc:
            raise APIError(400, str(exc), param=str(exc).split()[0]) from exc


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    suffix: str | None = None

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

    def template_messages(self) -> list[dict[str, str]]:
        if self.tools:
            raise APIError(400, "'tools' is not supported by this server yet", param="tools")
        return [{"role": m.role, "content": m.text()} for m in self.messages]


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


def _check_text(text: str) -> str:
    """JSON can carry lone surrogates ("\\ud800"): no tokenizer takes them, so refuse here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (it has a lone surrogate)") from None
    return text


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
