"""The answers of the OpenAI routes as pydantic models, for the OpenAPI schema only.

The routes build their bodies as plain dicts (responses.py, models.py, ...) and send
them as they are; these models only describe them, so that a client generator or a
fuzzer can check each answer against the schema. `route_responses()` gives a route's
``responses=`` entry: its 200 body (and the SSE stream, for the routes that stream) and
the error shape every 4xx and the 503 share. Documenting "4XX" also keeps FastAPI from
listing its own 422, which the app never sends (errors.py answers 400).
"""

from __future__ import annotations

from typing import Any, Literal

from hetero_infer.server.serving.chat_messages import ToolCall
from pydantic import BaseModel, ConfigDict

# A finished choice's reason: the engine's ("stop", "length", "abort" for a time limit,
# "error"), or "tool_calls" for a chat answer that called tools; null while streaming.
FinishReason = Literal["stop", "length", "abort", "error", "tool_calls"] | None


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error of every route, as OpenAI shapes it."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorInfo


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    # {"tokens", "token_logprobs", "top_logprobs", "text_offset"} when asked for.
    logprobs: dict[str, Any] | None
    finish_reason: FinishReason
    # The stop string or stop token id that ended the choice.
    stop_reason: str | int | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ChatAnswerMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None
    # With a reasoning parser: the model's thinking, apart from its answer.
    reasoning_content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatAnswerMessage
    # {"content": [{"token", "logprob", "bytes", "top_logprobs"}]} when asked for.
    logprobs: dict[str, Any] | None
    finish_reason: FinishReason
    stop_reason: str | int | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class EmbeddingData(BaseModel):
    object: Literal["embedding"]
    index: int
    # A list of floats, or (encoding_format "base64") their bytes: little-endian float32
    # unless vLLM's embed_dtype and endianness say other.
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    id: str  # vLLM's (OpenAI's answer has none)
    object: Literal["list"]
    created: int
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class ScoreData(BaseModel):
    index: int
    object: Literal["score"]
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreData]
    usage: EmbeddingUsage


class RerankedDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankedDocument | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None
    # None while the model loads.
    max_model_len: int | None
    permission: list[dict[str, Any]]


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int
    # Each token's string in the vocabulary, with return_token_strs.
    token_strs: list[str] | None


class DetokenizeResponse(BaseModel):
    prompt: str


def route_responses(
    answer: type[BaseModel], streams: bool = False, binary: bool = False
) -> dict[int | str, Any]:
    """A route's ``responses=``: its answer, the SSE stream where it ``streams`` (chunks
    as ``data:`` lines, then ``data: [DONE]``), or bytes where it answers in ``binary``
    too (vLLM's embeddings), and the errors."""
    ok: dict[str, Any] = {"model": answer}
    if streams:
        ok["content"] = {"text/event-stream": {}}
        ok["description"] = "The answer; with stream true, its chunks as server-sent events"
    if binary:
        ok["content"] = {"application/octet-stream": {}}
        ok["description"] = "The answer; with encoding_format bytes, the vectors' bytes"
    errors = {"model": ErrorResponse}
    return {
        200: ok,
        "4XX": {**errors, "description": "The request cannot be served as sent"},
        503: {**errors, "description": "Overloaded, loading, draining or failed: retry later"},
    }
