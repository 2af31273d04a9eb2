"""The body of /v1/chat/completions: the messages (tool calls and tool answers among
them), the tools the model may call and how it must choose, and what the chat template
gets of them."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from hetero_infer.engine.params.sampling_params import MAX_LOGPROBS
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.unsupported_fields import CHAT
from hetero_infer.server.serving.request_body import NULL_SCHEMA, check_text, check_texts
from hetero_infer.server.serving.sampling_fields import SamplingFields
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError

# Schemas of the fields checked by hand (request_body.py says why they are written out).
# ChatMessage.text() takes text parts only.
TEXT_PART_SCHEMA = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
CONTENT_SCHEMA = {
    "anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART_SCHEMA}, NULL_SCHEMA]
}
# What ChatMessage._tool_fields checks: only an assistant's message has tool_calls, and
# a tool message names the call it answers.
_NO_CALLS = {"type": "null"}
ROLE_RULES = [
    {"properties": {"role": {"enum": ["system", "user", "developer"]}, "tool_calls": _NO_CALLS}},
    {"properties": {"role": {"const": "assistant"}}},
    {
        "properties": {
            "role": {"const": "tool"},
            "tool_calls": _NO_CALLS,
            "tool_call_id": {"type": "string", "minLength": 1},
        },
        "required": ["tool_call_id"],
    },
]


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    # The JSON schema of the arguments object; None: the function takes none.
    parameters: dict[str, Any] | None = None
    # Whether the arguments must follow the schema exactly: the grammar makes them so
    # for tool_choice "required" or a named function (tool_choice.py checks the rest).
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """Arguments are a JSON object, so their schema must describe one. (A grammar
        is built from it only when tool_choice constrains the output, and checked then.)"""
        return value if value is None else check_object_schema(value)

    @model_validator(mode="after")
    def _valid_texts(self) -> FunctionDefinition:
        # The chat template writes all of it into the prompt.
        check_texts([self.name, self.description, self.parameters])
        return self


def check_object_schema(value: dict[str, Any]) -> dict[str, Any]:
    """ValueError unless ``value`` is a JSON schema of an object (what a tool's
    arguments are; Anthropic's input_schema takes the same check)."""
    kind = value.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise ValueError("must be a JSON schema of an object (type 'object')")
    properties = value.get("properties", {})
    if not isinstance(properties, dict) or not all(
        isinstance(p, dict | bool) for p in properties.values()
    ):
        raise ValueError("'properties' must map names to JSON schemas")
    required = value.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError("'required' must be a list of property names")
    return value


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """tool_choice naming the function the model must call."""

    type: Literal["function"]
    function: FunctionName


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message. Keys it does not know are refused (naming them): a message's text
    must not silently go missing from the prompt."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": ROLE_RULES})

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Annotated[str | list[dict[str, Any]] | None, WithJsonSchema(CONTENT_SCHEMA)] = None
    # An assistant's earlier calls, and the tool messages answering them (tool_call_id).
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    # An assistant's earlier reasoning, as this server (and vLLM) answer it; templates
    # that show past reasoning read reasoning_content. vLLM's newer name is reasoning.
    reasoning_content: str | None = None
    reasoning: str | None = None
    # What OpenAI's answers carry beside the content, which a client sending an answer
    # back as a message repeats: accepted when null only (nothing here would use them).
    refusal: Annotated[None, WithJsonSchema(NULL_SCHEMA)] = None
    audio: Annotated[None, WithJsonSchema(NULL_SCHEMA)] = None
    function_call: Annotated[None, WithJsonSchema(NULL_SCHEMA)] = None
    annotations: Annotated[None, WithJsonSchema(NULL_SCHEMA)] = None

    @field_validator("content")
    @classmethod
    def _valid_text(cls, value: Any) -> Any:
        parts = value if isinstance(value, list) else [{"text": value}]
        for part in parts:
            if isinstance(part.get("text"), str):
                check_text(part["text"])
        return value

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages have tool_calls")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            # As OpenAI: only an assistant's message that makes tool calls may go without.
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        # What else a chat template may write into the prompt (content is checked above).
        calls = [call.model_dump() for call in self.tool_calls or []]
        check_texts([self.name, self.tool_call_id, calls, self.reasoning_content, self.reasoning])
        if self.reasoning_content is not None and self.reasoning is not None:
            raise ValueError("give reasoning_content or reasoning, not both")
        return self

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
    UNSUPPORTED = CHAT

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[ToolDefinition] | None = None
    # None: "auto" when there are tools (as OpenAI and vLLM).
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Passed to the chat template (e.g. {"enable_thinking": false}).
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: end with the generation prompt (the default), or leave the last message
    # open for the model to go on with (a prefilled answer); not both.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # OpenAI's, given to the chat template as vLLM gives it (gpt-oss's reads it).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # OpenAI's, which change nothing here: nothing is stored, and the prompt cache
    # needs no key (prefix caching finds shared prompts by their tokens).
    store: bool | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None

    def check_template_flags(self) -> None:
        """A 400 for add_generation_prompt and continue_final_message that cannot hold."""
        if self.add_generation_prompt and self.continue_final_message:
            raise APIError(
                400,
                "continue_final_message cannot be used with add_generation_prompt: set "
                "add_generation_prompt to false to continue the last message",
                param="continue_final_message",
            )
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise APIError(
                400,
                "continue_final_message continues the last message, which must be the assistant's",
                param="continue_final_message",
            )

    def unsupported(self) -> None:
        super().unsupported()
        constraint = self.structured_output()
        constrained_tools = self.tools and self.tool_choice not in (None, "none", "auto")
        if constraint is not None and constrained_tools:
            raise APIError(
                400,
                f"'{constraint[0]}' cannot be combined with tool_choice 'required' or a "
                "named function: both constrain the output",
                param=constraint[0],
            )

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        """One message naming the field, not one per member of the union."""
        if value is None or value in ("none", "auto", "required"):
            return value
        try:
            return NamedToolChoice.model_validate(value)
        except PydanticValidationError:
            raise ValueError(
                'must be "none", "auto", "required" or '
                '{"type": "function", "function": {"name": ...}}'
            ) from None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _valid_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        check_texts(value)
        return value

    def template_kwargs(self) -> dict[str, Any] | None:
        """The chat template's variables: reasoning_effort, under the body's own."""
        if self.reasoning_effort is None:
            return self.chat_template_kwargs
        return {"reasoning_effort": self.reasoning_effort, **(self.chat_template_kwargs or {})}

    def logprobs_params(self) -> dict[str, int]:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(
                400, "logprobs must be set to true if top_logprobs is used", param="top_logprobs"
            )
        return {"logprobs": self.top_logprobs or 0} if self.logprobs else {}

    def template_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates take them: role and text content, and an assistant's
    tool calls with their arguments as objects (templates write them with ``tojson``),
    a tool message's tool_call_id, and a name and reasoning_content where given."""
    rendered = []
    for i, message in enumerate(messages):
        entry: dict[str, Any] = {"role": message.role, "content": message.text()}
        if message.name is not None:
            entry["name"] = message.name
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        reasoning = message.reasoning_content or message.reasoning
        if reasoning is not None:
            entry["reasoning_content"] = reasoning
        if message.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _arguments_object(call.function.arguments, i),
                    },
                }
                for call in message.tool_calls
            ]
        rendered.append(entry)
    return rendered


def _arguments_object(arguments: str, message_index: int) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise APIError(
            400,
            "a tool call's arguments must be a JSON object",
            param=f"messages.{message_index}.tool_calls",
        )
    return value
