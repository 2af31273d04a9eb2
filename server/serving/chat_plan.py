"""A chat request, whichever family's wire format it came in (ChatPlan): the
messages, the tools the model may call and how it must choose, what the chat template
gets of them, the output's limit, and the sampling fields. OpenAI's chat body extends
it with its own fields; Anthropic's and Ollama's bodies are translated into it.
chat_run.py makes it an engine request."""

from __future__ import annotations

from typing import Any, Literal

from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.chat_messages import ChatMessage, template_messages
from hetero_infer.server.serving.request_body import JsonObject
from hetero_infer.server.serving.sampling_fields import SamplingFields
from hetero_infer.server.serving.tool_definitions import NamedToolChoice, ToolDefinition
from pydantic import Field, field_validator
from pydantic import ValidationError as PydanticValidationError


class ChatPlan(SamplingFields):
    """The chat request every family's chat route makes of its body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    tools: list[ToolDefinition] | None = None
    # None: "auto" when there are tools (as OpenAI and vLLM).
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Passed to the chat template (e.g. {"enable_thinking": false}).
    chat_template_kwargs: JsonObject | None = None
    # vLLM's: the image processor's settings over the server's, for this request's images.
    mm_processor_kwargs: JsonObject | None = None
    # vLLM's: end with the generation prompt (the default), or leave the last message
    # open for the model to go on with (a prefilled answer); not both.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # vLLM's: the tokenizer's special tokens (a BOS) around the templated prompt, on top
    # of those the template writes (most templates write their own: false by default).
    add_special_tokens: bool = False
    # OpenAI's, given to the chat template as vLLM gives it (gpt-oss's reads it).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None

    def requested_max_tokens(self) -> int | None:
        """The output's limit the request asks for (None: what the context leaves)."""
        return self.max_tokens

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

    def template_kwargs(self) -> dict[str, Any] | None:
        """The chat template's variables: reasoning_effort, under the body's own."""
        if self.reasoning_effort is None:
            return self.chat_template_kwargs
        return {"reasoning_effort": self.reasoning_effort, **(self.chat_template_kwargs or {})}

    def template_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages)

    def image_count(self) -> int:
        """How many images the messages hold: the image markers the template writes."""
        return sum(message.image_count() for message in self.messages)


def check_template_flags(
    messages: list[ChatMessage], add_generation_prompt: bool, continue_final_message: bool
) -> None:
    """A 400 for vLLM's two ends of a templated conversation that cannot both hold: the
    generation prompt after the last message, or that message left open to go on with
    (which must be the assistant's)."""
    if add_generation_prompt and continue_final_message:
        raise APIError(
            400,
            "continue_final_message cannot be used with add_generation_prompt: set "
            "add_generation_prompt to false to continue the last message",
            param="continue_final_message",
        )
    if continue_final_message and (not messages or messages[-1].role != "assistant"):
        raise APIError(
            400,
            "continue_final_message continues the last message, which must be the assistant's",
            param="continue_final_message",
        )
