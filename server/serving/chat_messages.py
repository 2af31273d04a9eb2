"""A chat request's messages, whichever family's wire format they came in, and what
the chat template gets of them (template_messages).

The message form is OpenAI's chat message (role, content as a string or text parts and
in a user's message image_url parts, an assistant's tool_calls, a tool message's
tool_call_id): chat templates are written for OpenAI-shaped messages, so every family's
conversation is translated into this form. A template gets an image as {"type":
"image"} among the text parts (chat_images.py loads the images themselves).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.request_body import NULL_SCHEMA, check_text, check_texts
from pydantic import BaseModel, ConfigDict, WithJsonSchema, field_validator, model_validator

# OpenAI's image detail levels: taken, and the same to the model (its image processor
# decides an image's tokens).
IMAGE_DETAILS = ("auto", "low", "high")

# Schemas of the fields checked by hand (request_body.py says why they are written out).
# Content parts are text, and in a user's message images (ChatMessage._valid_parts).
TEXT_PART_SCHEMA = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
IMAGE_PART_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"const": "image_url"},
        "image_url": {
            "type": "object",
            "properties": {"url": {"type": "string"}, "detail": {"enum": list(IMAGE_DETAILS)}},
            "required": ["url"],
        },
    },
    "required": ["type", "image_url"],
}
CONTENT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"anyOf": [TEXT_PART_SCHEMA, IMAGE_PART_SCHEMA]}},
        NULL_SCHEMA,
    ]
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
    def _valid_parts(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value if value is None else check_text(value)
        for j, part in enumerate(value):
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                check_text(part["text"])
            elif kind == "image_url":
                _check_image_part(part, j)
            elif kind == "text":
                raise ValueError(f"part {j}: a text part needs its text as a string")
            else:
                raise ValueError(
                    f"part {j}: parts of type {str(kind)[:64]!r} are not supported (only "
                    "text and image_url)"
                )
        return value

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages have tool_calls")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            # As OpenAI: only an assistant's message that makes tool calls may go without.
            raise ValueError(f"a {self.role} message needs content")
        if self.role != "user" and self.image_count():
            raise ValueError(f"only a user message may hold images, not a {self.role} message")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        # What else a chat template may write into the prompt (content is checked above).
        calls = [call.model_dump() for call in self.tool_calls or []]
        check_texts([self.name, self.tool_call_id, calls, self.reasoning_content, self.reasoning])
        if self.reasoning_content is not None and self.reasoning is not None:
            raise ValueError("give reasoning_content or reasoning, not both")
        return self

    def image_count(self) -> int:
        parts = self.content if isinstance(self.content, list) else []
        return sum(part["type"] == "image_url" for part in parts)

    def template_content(self) -> str | list[dict[str, str]]:
        """The content as the chat template takes it: a string (text parts joined), or
        where it holds images its parts in order, each image as {"type": "image"} (the
        part for which Hugging Face's vision-language templates write an image marker)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        if not self.image_count():
            return "".join(part["text"] for part in self.content)
        return [
            {"type": "text", "text": part["text"]} if part["type"] == "text" else {"type": "image"}
            for part in self.content
        ]


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates take them: role and text content, and an assistant's
    tool calls with their arguments as objects (templates write them with ``tojson``),
    a tool message's tool_call_id, and a name and reasoning_content where given."""
    rendered = []
    for i, message in enumerate(messages):
        entry: dict[str, Any] = {"role": message.role, "content": message.template_content()}
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


def _check_image_part(part: dict[str, Any], index: int) -> None:
    image = part.get("image_url")
    if set(part) - {"type", "image_url"} or not isinstance(image, dict):
        raise ValueError(
            f'part {index}: an image part is {{"type": "image_url", "image_url": {{"url": ...}}}}'
        )
    if not isinstance(image.get("url"), str) or set(image) - {"url", "detail"}:
        raise ValueError(f"part {index}: image_url takes a url (a string) and a detail")
    if image.get("detail", "auto") not in IMAGE_DETAILS:
        raise ValueError(
            f"part {index}: image_url.detail must be one of {', '.join(IMAGE_DETAILS)}"
        )


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
