"""The bodies of /v1/messages and /v1/messages/count_tokens, as Anthropic's Messages API
defines them: a system prompt, user and assistant turns of content blocks (text,
image, tool_use, tool_result), the tools and how the model must choose among them, and the
sampling fields.

Every model forbids fields it does not know: a field this server cannot honour is a
400 naming it, never silently ignored. ``cache_control`` (prompt caching is automatic
here: the prefix cache) and ``metadata`` are accepted and have no effect.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from hetero_infer.engine.params.sampling_params import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS
from hetero_infer.server.serving.request_body import (
    MAX_JSON_DEPTH,
    JsonObject,
    check_depth,
    check_text,
)
from hetero_infer.server.serving.tool_definitions import check_object_schema
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)


def _text_as_blocks(value: Any) -> Any:
    """A string is one text block: content is checked as blocks only, so an error
    names the block it is in (not the string alternative too)."""
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


def _string_or_blocks(types: list[str]) -> dict[str, Any]:
    """The schema of a field taking a string or blocks (written out: the field is
    validated as blocks after strings become one)."""
    block = {
        "type": "object",
        "properties": {"type": {"enum": types}},
        "required": ["type"],
    }
    return {"anyOf": [{"type": "string"}, {"type": "array", "items": block}]}


# Texts the chat template writes into the prompt: valid Unicode (no lone surrogates).
Text = Annotated[str, AfterValidator(check_text)]


class AnthropicModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextBlock(AnthropicModel):
    type: Literal["text"]
    text: Text
    cache_control: dict[str, Any] | None = None  # accepted, no effect
    # What an answer's text block may carry back in a later turn (this server sends none).
    citations: list[dict[str, Any]] | None = None


class ToolUseBlock(AnthropicModel):
    """An assistant's earlier call of a tool."""

    type: Literal["tool_use"]
    id: Text = Field(min_length=1)
    name: Text = Field(min_length=1)
    input: JsonObject
    cache_control: dict[str, Any] | None = None


# A string, or text blocks.
TextBlocks = Annotated[
    list[TextBlock], BeforeValidator(_text_as_blocks), WithJsonSchema(_string_or_blocks(["text"]))
]


class ToolResultBlock(AnthropicModel):
    """A user turn's answer to the tool_use block ``tool_use_id``."""

    type: Literal["tool_result"]
    tool_use_id: Text = Field(min_length=1)
    content: TextBlocks | None = None
    # Rendered as "Error: " before the content: templates have no field for it.
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        text = "".join(block.text for block in self.content or [])
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(AnthropicModel):
    """An earlier answer's thinking, sent back: left out of the prompt, as Anthropic
    leaves earlier turns' thinking out of the context."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(AnthropicModel):
    type: Literal["redacted_thinking"]
    data: str


class Base64ImageSource(AnthropicModel):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(min_length=1)


class URLImageSource(AnthropicModel):
    type: Literal["url"]
    url: str = Field(min_length=1)


class ImageBlock(AnthropicModel):
    """A user's image, its bytes in base64 or at an http(s) URL (Anthropic's files API,
    a source of type "file", is not served)."""

    type: Literal["image"]
    source: Annotated[Base64ImageSource | URLImageSource, Field(discriminator="type")]
    cache_control: dict[str, Any] | None = None

    def url(self) -> str:
        """The image as a URL: base64 bytes as a data: URL."""
        source = self.source
        if isinstance(source, Base64ImageSource):
            return f"data:{source.media_type};base64,{source.data}"
        return source.url


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]
ALL_BLOCKS = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")
# Which blocks each role's turns may hold.
ROLE_BLOCKS = {
    "user": ("text", "image", "tool_result"),
    "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
}


class InputMessage(AnthropicModel):
    role: Literal["user", "assistant"]
    content: Annotated[
        list[ContentBlock],
        BeforeValidator(_text_as_blocks),
        WithJsonSchema(_string_or_blocks(list(ALL_BLOCKS))),
    ]

    @model_validator(mode="after")
    def _blocks_fit_the_role(self) -> InputMessage:
        allowed = ROLE_BLOCKS[self.role]
        for i, block in enumerate(self.content):
            if block.type not in allowed:
                raise ValueError(
                    f"content.{i}: a {self.role} turn cannot hold a {block.type} block"
                )
        return self

    def blocks(self) -> list[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock]:
        """The content's blocks, thinking left out."""
        kept = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock
        return [b for b in self.content if isinstance(b, kept)]


class Tool(AnthropicModel):
    """A client tool. Anthropic's server tools (web search, code execution...) have a
    ``type`` of their own and are refused."""

    type: Literal["custom"] | None = None
    name: Text = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: Text | None = None
    input_schema: Annotated[JsonObject, AfterValidator(check_object_schema)]
    cache_control: dict[str, Any] | None = None


class ToolChoice(AnthropicModel):
    """auto: the model decides; any: it must call some tool; tool: it must call ``name``;
    none: it calls none."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_with_tool_only(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError('tool_choice of type "tool" needs the tool\'s name')
        if self.type != "tool" and self.name is not None:
            raise ValueError(f'tool_choice of type "{self.type}" takes no name')
        return self


class Metadata(AnthropicModel):
    user_id: str | None = None


class ThinkingEnabled(AnthropicModel):
    """Extended thinking: the template gets enable_thinking, and the thinking may hold
    budget_tokens before its end is forced (vLLM's thinking_token_budget)."""

    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1)  # (Anthropic's least is 1,024; any is served here)


class ThinkingDisabled(AnthropicModel):
    """No thinking: the template gets enable_thinking false."""

    type: Literal["disabled"]


Thinking = Annotated[ThinkingEnabled | ThinkingDisabled, Field(discriminator="type")]


class ConversationFields(AnthropicModel):
    """What both routes render into the prompt."""

    @model_validator(mode="before")
    @classmethod
    def _not_too_deep(cls, data: Any) -> Any:
        # Before anything recurses into it (a schema's copy, the template).
        check_depth(data, MAX_JSON_DEPTH)
        return data

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: TextBlocks | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    cache_control: dict[str, Any] | None = None  # accepted, no effect

    @model_validator(mode="after")
    def _ends_with_a_user_turn(self) -> ConversationFields:
        if self.messages[-1].role != "user":
            # Anthropic continues a final assistant turn (prefill); templates here
            # always open a new turn after the messages, so that is refused.
            raise ValueError(
                "messages: the last message must be a user turn (continuing a final "
                "assistant turn, prefill, is not supported)"
            )
        return self

    def system_text(self) -> str | None:
        if self.system is None:
            return None
        return "\n".join(block.text for block in self.system) or None


class CountTokensRequest(ConversationFields):
    """/v1/messages/count_tokens: the prompt /v1/messages would build."""


class MessagesRequest(ConversationFields):
    """/v1/messages."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[Annotated[Text, Field(max_length=MAX_STOP_STRING_CHARS)]] | None = Field(
        default=None, max_length=MAX_STOP_STRINGS
    )
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    # 0 samples from every token, as the engine's -1 does.
    top_k: int | None = Field(default=None, ge=0, le=2**63 - 1)
    metadata: Metadata | None = None  # accepted, no effect
    stream: bool = False
    thinking: Thinking | None = None

    @model_validator(mode="after")
    def _budget_under_max_tokens(self) -> MessagesRequest:
        thinking = self.thinking
        if isinstance(thinking, ThinkingEnabled) and thinking.budget_tokens >= self.max_tokens:
            raise ValueError("thinking.budget_tokens must be less than max_tokens (as Anthropic)")
        return self
