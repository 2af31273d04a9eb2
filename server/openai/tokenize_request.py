"""The bodies of /tokenize (a prompt, or messages through the chat template) and
/detokenize (token ids), as in vLLM."""

from __future__ import annotations

from hetero_infer.server.openai.unsupported_fields import TOKENIZE
from hetero_infer.server.serving.chat_messages import ChatMessage
from hetero_infer.server.serving.request_body import JsonObject, RequestBody, TokenId, check_text
from hetero_infer.server.serving.tool_definitions import ToolDefinition
from pydantic import field_validator


class TokenizeRequest(RequestBody):
    UNSUPPORTED = TOKENIZE

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # The tokenizer's special tokens (null: around a prompt, not around messages, whose
    # template writes its own; vLLM's defaults).
    add_special_tokens: bool | None = None
    # With messages, as a chat request gives them to the template.
    tools: list[ToolDefinition] | None = None
    chat_template_kwargs: JsonObject | None = None
    mm_processor_kwargs: JsonObject | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # vLLM's: each token's string in the vocabulary too ("token_strs").
    return_token_strs: bool | None = False

    @field_validator("prompt")
    @classmethod
    def _valid_text(cls, value: str | None) -> str | None:
        return value if value is None else check_text(value)


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[TokenId]
