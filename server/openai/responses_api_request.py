"""The body of /v1/responses (OpenAI's Responses API) and the chat request it becomes.

A chat request does the work, as for the chat route (serving/chat_run.py: template,
tools, reasoning, sampling, the JSON schema's grammar): ``chat_request`` writes the body
in its terms, ``instructions`` as a first system message and the items as chat
messages (responses_api_items.py).

A field OpenAI defines that we cannot honour is refused with a 400 naming it unless it
is null or a value that changes nothing (RESPONSES_UNSUPPORTED); a field OpenAI does
not define is refused as unrecognized (request_body.RequestBody).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.chat_request import ChatCompletionRequest
from hetero_infer.server.openai.responses_api_items import INPUT_SCHEMA
from hetero_infer.server.serving.request_body import (
    NULL_SCHEMA,
    RequestBody,
    Unsupported,
    check_text,
)
from hetero_infer.server.serving.tool_definitions import FunctionDefinition
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError

# OpenAI's bounds on metadata: 16 pairs, keys of 64 characters, values of 512.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512

_NO = Unsupported()
# OpenAI's fields we do not implement; the values besides null that change nothing.
RESPONSES_UNSUPPORTED = {
    "background": Unsupported((False,)),
    "truncation": Unsupported(("disabled",)),
    # Reasoning is plain text in its output item here: there is no encrypted copy.
    "include": Unsupported(([], ["reasoning.encrypted_content"])),
    "top_logprobs": Unsupported((0,)),
    "service_tier": Unsupported(("auto", "default")),
    "prompt": _NO,
    "conversation": Unsupported(why="is not supported: use previous_response_id"),
    "max_tool_calls": _NO,
    "prompt_cache_retention": _NO,
    "stream_options": _NO,
}

TEXT_FORMAT_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"type": {"enum": ["text", "json_object"]}},
            "required": ["type"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "json_schema"},
                "name": {"type": "string"},
                "schema": {"type": "object"},
                "strict": {"type": ["boolean", "null"]},
            },
            "required": ["type", "schema"],
        },
        NULL_SCHEMA,
    ]
}


class FunctionTool(FunctionDefinition):
    """A function tool, flat as the Responses API writes it (chat nests the same fields
    under ``function``, whose checks it takes)."""

    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _function_only(cls, data: Any) -> Any:
        """The type first: a hosted tool would otherwise be told it lacks a name."""
        if isinstance(data, dict) and data.get("type") != "function":
            shown = str(data.get("type"))[:64]
            raise ValueError(f"only function tools are supported, not type {shown!r}")
        return data

    def chat_tool(self) -> dict[str, Any]:
        return {"type": "function", "function": self.model_dump(exclude={"type"})}


class NamedFunction(BaseModel):
    """tool_choice naming the function the model must call."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str


class ReasoningConfig(BaseModel):
    """OpenAI's reasoning options, as vLLM takes them: the effort goes to the chat
    template as reasoning_effort (the chat route's field; gpt-oss's template reads it)."""

    model_config = ConfigDict(extra="forbid")

    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # No summary is made: a reasoning item carries the reasoning's own text.
    summary: Literal["auto", "concise", "detailed"] | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # {"type": "text" | "json_object"} or {"type": "json_schema", "name", "schema",
    # "strict", "description"}, checked by response_format() (for its messages).
    format: Annotated[dict[str, Any] | None, WithJsonSchema(TEXT_FORMAT_SCHEMA)] = None
    # OpenAI's hint for its own models' length; only its default is taken.
    verbosity: Literal["medium"] | None = None

    def response_format(self) -> dict[str, Any] | None:
        """The chat route's response_format for this format."""
        fmt = self.format
        if fmt is None or fmt.get("type") in ("text", "json_object"):
            return fmt
        if fmt.get("type") == "json_schema":
            schema = fmt.get("schema")
            if not isinstance(schema, dict):
                raise APIError(
                    400, "text.format: json_schema needs a 'schema' object", param="text.format"
                )
            spec = {"name": fmt.get("name") or "response", "schema": schema}
            return {"type": "json_schema", "json_schema": spec}
        raise APIError(
            400,
            "text.format: type must be 'text', 'json_object' or 'json_schema'",
            param="text.format",
        )


class ResponsesRequest(RequestBody):
    UNSUPPORTED = RESPONSES_UNSUPPORTED

    model: str | None = None
    input: Annotated[str | list[dict[str, Any]], WithJsonSchema(INPUT_SCHEMA)]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    # None: "auto" when there are tools (as OpenAI).
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    # Kept for previous_response_id and GET /v1/responses/{id} (OpenAI's default).
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    # OpenAI's, which change nothing here (as on the chat route): an end user's id, and
    # a key for the prompt cache, which finds shared prompts by their tokens.
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _input(cls, value: Any) -> Any:
        """One message, not one per member of the union (the items are checked one by
        one later, naming their fields)."""
        if isinstance(value, str | list):
            return value
        raise ValueError("must be a string or a list of input items")

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        if value is None or value in ("none", "auto", "required"):
            return value
        try:
            return NamedFunction.model_validate(value)
        except PydanticValidationError:
            raise ValueError(
                'must be "none", "auto", "required" or {"type": "function", "name": ...}'
            ) from None

    @field_validator("instructions", "user", "previous_response_id")
    @classmethod
    def _valid_text(cls, value: str | None) -> str | None:
        return value if value is None else check_text(value)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} key-value pairs")
        for key, text in value.items():
            if len(key) > MAX_METADATA_KEY or len(text) > MAX_METADATA_VALUE:
                raise ValueError(
                    f"keys are at most {MAX_METADATA_KEY} characters, "
                    f"values at most {MAX_METADATA_VALUE}"
                )
            check_text(key)
            check_text(text)
        return value

    def chat_request(self, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
        """The chat request of this body over ``messages`` (the conversation so far
        and this body's items, as chat messages)."""
        if self.instructions is not None:
            messages = [{"role": "system", "content": self.instructions}, *messages]
        if not messages:
            raise APIError(400, "input must not be empty", param="input")
        tool_choice: Any = self.tool_choice
        if isinstance(tool_choice, NamedFunction):
            tool_choice = {"type": "function", "function": {"name": tool_choice.name}}
        values = {
            "model": self.model,
            "messages": messages,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "user": self.user,
            "tools": [tool.chat_tool() for tool in self.tools] if self.tools else None,
            "tool_choice": tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": self.text.response_format() if self.text else None,
            "reasoning_effort": self.reasoning.effort if self.reasoning else None,
        }
        try:
            return ChatCompletionRequest.model_validate(values)
        except PydanticValidationError as exc:
            # What the items' own checks let through and a chat message refuses.
            raise APIError(400, f"input: {exc.errors()[0]['msg']}", param="input") from None
