"""The answers of the Ollama routes as pydantic models, for the OpenAPI schema only
(the routes send plain dicts, as the OpenAI routes do: server/openai/answers.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class OllamaError(BaseModel):
    """Every error of the /api/* routes."""

    error: str


class Timings(BaseModel):
    """On the last object (done: true); durations in nanoseconds."""

    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_cached_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None


class ChatAnswer(Timings):
    model: str
    created_at: str
    # role "assistant", content, and thinking / tool_calls / logprobs where there are any.
    message: dict[str, Any]
    done: bool


class GenerateAnswer(Timings):
    model: str
    created_at: str
    response: str
    thinking: str | None = None
    done: bool
    context: list[int] | None = None


class EmbedAnswer(BaseModel):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class EmbeddingsAnswer(BaseModel):
    embedding: list[float]


class ModelDetails(BaseModel):
    parent_model: str
    format: str
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str


class TagEntry(BaseModel):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: ModelDetails


class TagList(BaseModel):
    models: list[TagEntry]


class RunningEntry(BaseModel):
    name: str
    model: str
    size: int
    digest: str
    details: ModelDetails
    expires_at: str
    size_vram: int
    context_length: int


class RunningList(BaseModel):
    models: list[RunningEntry]


class ShowAnswer(BaseModel):
    license: str
    modelfile: str
    parameters: str
    template: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class VersionAnswer(BaseModel):
    version: str


def ollama_responses(answer: type[BaseModel], streams: bool = False) -> dict[int | str, Any]:
    """A route's ``responses=``: its answer (NDJSON chunks where it ``streams``) and
    its errors, in Ollama's shape."""
    ok: dict[str, Any] = {"model": answer}
    if streams:
        ok["content"] = {"application/x-ndjson": {}}
        ok["description"] = "The answer; unless stream is false, its chunks, one JSON a line"
    errors = {"model": OllamaError}
    return {
        200: ok,
        "4XX": {**errors, "description": "The request cannot be served as sent"},
        503: {**errors, "description": "Overloaded, loading, draining or failed: retry later"},
    }
