"""The answers of /v1/responses as pydantic models, for the OpenAPI schema only (as
answers.py for the other routes): responses_api.py builds its bodies as plain dicts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputText(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"]
    text: str


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"]
    status: ItemStatus
    role: Literal["assistant"]
    content: list[OutputText]


class FunctionCallOutput(BaseModel):
    """A call the model made: ``arguments`` is the JSON text of its arguments."""

    id: str
    type: Literal["function_call"]
    status: ItemStatus
    call_id: str
    name: str
    arguments: str


class ReasoningOutput(BaseModel):
    """With the server's reasoning parser: the model's thinking, apart from its answer."""

    id: str
    type: Literal["reasoning"]
    status: ItemStatus
    summary: list[Any]
    content: list[ReasoningText]


class IncompleteDetails(BaseModel):
    # "max_output_tokens", or "timeout" (this server's: the request's time limit).
    reason: str


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    error: dict[str, Any] | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputMessage | FunctionCallOutput | ReasoningOutput]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any] | None
    store: bool
    temperature: float | None
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float | None
    truncation: Literal["disabled"]
    # None until the response has finished (in response.created / .in_progress).
    usage: ResponseUsage | None
    user: str | None
    safety_identifier: str | None
    prompt_cache_key: str | None
    metadata: dict[str, str]


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response.deleted"]
    deleted: bool
