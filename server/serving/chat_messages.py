"""A chat request's messages, whichever family's wire format they came in, and what
the chat template gets of them (template_messages).

The message form is OpenAI's chat message (role, content as a string or text parts, an
assistant's tool_calls, a tool message's tool_call_id): chat templates are written for
OpenAI-shaped messages, so every family's conversation is translated into this form.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.request_body import NULL_SCHEMA, check_text, check_texts
from pydantic import BaseModel, ConfigDict, WithJsonSchema, field_validator, model_validator

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


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message, in OpenAI's wire shape (the shape chat templates take, which the
    other families' messages are translated into). Keys it does not know are refused
    (naming them): a message's text must not silently go missing from the prompt."""

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
