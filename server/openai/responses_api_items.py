"""The conversation items of /v1/responses, as its ``input`` takes them and as a stored
response continues them: messages, function calls and their outputs, reasoning; and
the chat messages they become for the chat template.

Each item is checked with its own model, so a bad one is a 400 naming the item's field
(``input.2.arguments``), not a union's guess at what it might have been. An earlier
response's output items may be passed back as they came (ids, status, annotations).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.chat_images import ImageSource, image_url_part
from hetero_infer.server.serving.request_body import check_text, check_texts
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError

ItemStatus = Literal["in_progress", "completed", "incomplete"]
# The content parts a function's output takes, and those a message takes.
TEXT_PARTS = ("input_text", "output_text")
MESSAGE_PARTS = (*TEXT_PARTS, "input_image")

# What the body's schema says of ``input`` (request_body.py says why it is written out):
# a string, or items that parse_items checks one by one.
_TEXT_PART_SCHEMA = {
    "type": "object",
    "properties": {"type": {"enum": ["input_text", "output_text"]}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_IMAGE_PART_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"const": "input_image"},
        "image_url": {"type": "string"},
        "detail": {"enum": ["auto", "low", "high"]},
    },
    "required": ["type", "image_url"],
}
_CONTENT_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART_SCHEMA}]}
_MESSAGE_CONTENT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"anyOf": [_TEXT_PART_SCHEMA, _IMAGE_PART_SCHEMA]}},
    ]
}
INPUT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {
                            "type": {"const": "message"},
                            "role": {"enum": ["user", "system", "developer", "assistant"]},
                            "content": _MESSAGE_CONTENT_SCHEMA,
                        },
                        "required": ["role", "content"],
                    },
                    {
                        "type": "object",
                        "properties": {
                            "type": {"const": "function_call"},
                            "call_id": {"type": "string"},
                            "name": {"type": "string"},
                            "arguments": {"type": "string"},
                        },
                        "required": ["type", "call_id", "name", "arguments"],
                    },
                    {
                        "type": "object",
                        "properties": {
                            "type": {"const": "function_call_output"},
                            "call_id": {"type": "string"},
                            "output": _CONTENT_SCHEMA,
                        },
                        "required": ["type", "call_id", "output"],
                    },
                    {
                        "type": "object",
                        "properties": {"type": {"const": "reasoning"}},
                        "required": ["type"],
                    },
                ]
            },
        },
    ]
}


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _valid_texts(self) -> _Item:
        # The chat template writes its texts into the prompt.
        check_texts(self.model_dump())
        return self


class TextPart(BaseModel):
    """A text content part: the user's ``input_text``, or an earlier answer's
    ``output_text`` (with what our answers carry beside its text)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputImagePart(BaseModel):
    """A user's image: ``image_url`` a data: URL (base64) or an http(s) URL. OpenAI's
    ``file_id`` names an upload to its files API, which this server has not
    (_content_value refuses it)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None  # taken; the model decides


def _joined(content: str | list[TextPart] | list[TextPart | InputImagePart]) -> str:
    """The content's text (its text parts joined)."""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if isinstance(part, TextPart))


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Annotated[TextPart | InputImagePart, Field(discriminator="type")]]
    id: str | None = None
    status: ItemStatus | None = None
    phase: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> Any:
        return _content_value(value, MESSAGE_PARTS)

    @model_validator(mode="after")
    def _images_from_the_user(self) -> MessageItem:
        if self.role != "user" and self.images():
            raise ValueError(f"only a user message may hold images, not a {self.role} message")
        return self

    def images(self) -> list[tuple[int, str]]:
        """Each image part's index in the content, and its URL."""
        parts = [] if isinstance(self.content, str) else self.content
        return [
            (j, p.image_url or "") for j, p in enumerate(parts) if isinstance(p, InputImagePart)
        ]

    def chat_content(self) -> str | list[dict[str, Any]]:
        """The content as a chat message's: a string, or with images OpenAI's chat parts."""
        if not self.images():
            return _joined(self.content)
        return [
            image_url_part(part.image_url or "")
            if isinstance(part, InputImagePart)
            else {"type": "text", "text": part.text}
            for part in self.content
        ]


class FunctionCallItem(_Item):
    """A call the model made earlier (an earlier answer's output, passed back)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text of an object, as the model wrote it
    id: str | None = None
    status: ItemStatus | None = None

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise ValueError("must be the JSON text of an object")
        return value

    def chat_call(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.call_id, "type": "function", "function": function}


class FunctionCallOutputItem(_Item):
    """What the caller's function returned, for the call ``call_id``."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]
    id: str | None = None
    status: ItemStatus | None = None

    @field_validator("output", mode="before")
    @classmethod
    def _output(cls, value: Any) -> Any:
        return _content_value(value)


class ReasoningItem(_Item):
    """An earlier answer's reasoning, passed back: taken, and left out of the prompt
    (as chat templates leave earlier turns' thinking out)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = []
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
_ITEM_MODELS: dict[str, type[BaseModel]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


def _content_value(value: Any, taken: tuple[str, ...] = TEXT_PARTS) -> Any:
    """One message for content that is neither a string nor a list of the ``taken``
    parts (the union would report a guess per member)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        raise ValueError("must be a string or a list of content parts")
    # A type may be any JSON value, a list or an object too: named by its text.
    kinds = {str(p.get("type"))[:64] for p in value} - set(taken)
    if kinds:
        shown = sorted(kinds)
        raise ValueError(f"only {', '.join(taken)} content parts are supported here, not {shown}")
    for j, part in enumerate(value):
        # Checked here, not by InputImagePart: the union's errors would name its string form.
        if part.get("type") == "input_image" and part.get("file_id") is not None:
            raise ValueError(
                f"part {j}: file_id is not supported (this server has no files API): give "
                "the image as image_url, a data: URL (base64) or an http(s) URL"
            )
        if part.get("type") == "input_image" and not isinstance(part.get("image_url"), str):
            raise ValueError(f"part {j}: an input_image needs its image_url (a string)")
    return value


def parse_items(raw: str | list[Any], param: str = "input") -> list[InputItem]:
    """The items of ``input`` (a string is one user message), each checked by its own
    model; a bad one is a 400 naming the item's field."""
    if isinstance(raw, str):
        try:
            check_text(raw)
        except ValueError as exc:  # outside validation: a 500 unless made a 400 here
            raise APIError(400, f"{param}: {exc}", param=param) from None
        return [MessageItem(role="user", content=raw)]
    items: list[InputItem] = []
    for index, entry in enumerate(raw):
        where = f"{param}.{index}"
        if not isinstance(entry, dict):
            raise APIError(400, f"{where}: an item must be an object", param=where)
        # OpenAI's short form of a message has a role and no type.
        kind = entry.get("type", "message")
        model = _ITEM_MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise APIError(
                400,
                f"{where}.type: items of type {str(kind)[:64]!r} are not supported "
                f"(only {', '.join(_ITEM_MODELS)})",
                param=f"{where}.type",
            )
        try:
            items.append(model.model_validate(entry))  # type: ignore[arg-type]
        except PydanticValidationError as exc:
            raise _item_error(exc, where) from None
    return items


def _item_error(exc: PydanticValidationError, where: str) -> APIError:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"])
    param = f"{where}.{field}" if field else where
    return APIError(400, f"{param}: {first['msg']}", param=param)


def chat_messages(items: list[InputItem]) -> list[dict[str, Any]]:
    """The items as chat messages (chat_messages.ChatMessage's fields): a function call
    joins the assistant message before it (its text, or the calls made with it), a
    call's output is a ``tool`` message, reasoning is left out."""
    messages: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.chat_content()})
        elif isinstance(item, FunctionCallItem):
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(item.chat_call())
            else:
                messages.append(
                    {"role": "assistant", "content": None, "tool_calls": [item.chat_call()]}
                )
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": _joined(item.output)}
            )
    return messages


def item_images(items: list[InputItem], param: str = "input") -> list[ImageSource]:
    """The images of the items' messages, in order, each named by its place."""
    return [
        ImageSource(url, f"{param}.{i}.content.{j}")
        for i, item in enumerate(items)
        if isinstance(item, MessageItem)
        for j, url in item.images()
    ]


def item_dicts(items: list[InputItem]) -> list[dict[str, Any]]:
    """Items as plain JSON, as a stored response keeps its conversation."""
    return [item.model_dump(exclude_none=True) for item in items]
