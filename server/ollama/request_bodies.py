"""The bodies of Ollama's /api/chat, /api/generate, /api/embed, /api/embeddings and
/api/show.

Fields Ollama documents are typed here; any other field is refused with a 400 naming
it (a client must never get silently different behaviour). What needs the model (the
template, the tools, the context length) is checked when the request is built.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from hetero_infer.engine.params.sampling_params import MAX_LOGPROBS
from hetero_infer.server.errors import APIError
from hetero_infer.server.ollama.options import OllamaOptions
from hetero_infer.server.serving.request_body import (
    MAX_EMBEDDING_INPUTS,
    RequestBody,
    TokenId,
    check_text,
)
from hetero_infer.server.serving.tool_definitions import ToolDefinition
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

# Texts the tokenizer will see: valid Unicode, or a 400 naming the field.
Text = Annotated[str, AfterValidator(check_text)]
# How long the model stays loaded after the request: accepted, and moot (it never unloads).
KeepAlive = str | float | None
# true / false, or gpt-oss's effort levels (passed to the template as reasoning_effort).
Think = bool | Literal["high", "medium", "low"] | None


class OllamaFunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None


class OllamaToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    type: Literal["function"] | None = None
    function: OllamaFunctionCall


class OllamaMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: Text = ""
    # An assistant's earlier thinking: templates that show it get it as reasoning_content.
    thinking: Text | None = None
    # A user's images, each its file's bytes in base64.
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    # A tool message: the tool that answered (and the call it answers, where given).
    tool_name: Text | None = None
    tool_call_id: Text | None = None


class GenerationBody(RequestBody):
    """What /api/chat and /api/generate share."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    stream: bool = True
    # "json" (any JSON object) or a JSON schema the output must follow; "" or null: text.
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: OllamaOptions | None = None
    keep_alive: KeepAlive = None
    think: Think = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @field_validator("format", mode="before")
    @classmethod
    def _format(cls, value: Any) -> Any:
        if value is None or value in ("", "json") or isinstance(value, dict):
            return value
        raise ValueError('must be "json" or a JSON schema object')

    def response_format(self) -> dict[str, Any] | None:
        """``format`` as the sampling fields' response_format (OpenAI's)."""
        if not self.format:
            return None
        if self.format == "json":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": self.format}}

    @property
    def checked_options(self) -> OllamaOptions:
        return self.options or OllamaOptions()

    def top_logprobs_count(self) -> int | None:
        """SamplingParams' logprobs: None unless asked."""
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class ChatRequest(GenerationBody):
    # Empty: the model is only loaded (it always is): an empty answer, done_reason "load".
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[ToolDefinition] | None = None


class GenerateRequest(GenerationBody):
    # Empty (and no context): the model is only loaded, as for /api/chat.
    prompt: Text = ""
    suffix: Text | None = None
    system: Text | None = None
    # Ollama's Go template: refused unless empty or the server's own chat template.
    template: str | None = None
    # The token ids a previous /api/generate answer returned as its context.
    context: list[TokenId] | None = None
    raw: bool = False
    # Images for the prompt (through the chat template), each in base64.
    images: list[str] | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("fill-in-the-middle (suffix) is not supported")
        return value


class EmbedRequest(RequestBody):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    input: Text | list[Text]
    # Cut each input to the context length (Ollama's default); false: a 400 instead.
    truncate: bool = True
    options: OllamaOptions | None = None
    keep_alive: KeepAlive = None
    # Accepted only as the model's own size (as /v1/embeddings' dimensions).
    dimensions: int | None = None

    @field_validator("input")
    @classmethod
    def _not_too_many(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs")
        return value

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input


class EmbeddingsRequest(RequestBody):
    """The older /api/embeddings: one prompt (empty: the model is only loaded)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    prompt: Text = ""
    options: OllamaOptions | None = None
    keep_alive: KeepAlive = None


class ShowRequest(RequestBody):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    name: str | None = None  # the field's older name, which some clients still send
    verbose: bool | None = None

    def model_name(self) -> str:
        name = self.model or self.name
        if not name:
            raise APIError(400, "model is required", param="model")
        return name
