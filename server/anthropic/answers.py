"""The Anthropic routes' answers as pydantic models, for the OpenAPI schema only (the
routes build plain dicts: messages.py, messages_stream.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextContent(BaseModel):
    type: Literal["text"]
    text: str


class ThinkingContent(BaseModel):
    """With a reasoning parser: the model's thinking, apart from its answer."""

    type: Literal["thinking"]
    thinking: str
    signature: str


class ToolUseContent(BaseModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(BaseModel):
    input_tokens: int  # the prompt's, less those read from the cache
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    output_tokens: int


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    content: list[TextContent | ThinkingContent | ToolUseContent]
    model: str
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage


class CountTokensResponse(BaseModel):
    input_tokens: int


class AnthropicErrorInfo(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Every error of these routes, as Anthropic shapes it."""

    type: Literal["error"]
    error: AnthropicErrorInfo


def route_responses(answer: type[BaseModel], streams: bool = False) -> dict[int | str, Any]:
    ok: dict[str, Any] = {"model": answer}
    if streams:
        ok["content"] = {"text/event-stream": {}}
        ok["description"] = "The message; with stream true, its events as server-sent events"
    errors = {"model": AnthropicErrorResponse}
    return {
        200: ok,
        "4XX": {**errors, "description": "The request cannot be served as sent"},
        503: {**errors, "description": "Overloaded, loading, draining or failed: retry later"},
    }
