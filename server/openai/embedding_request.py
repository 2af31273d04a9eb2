"""The body of /v1/embeddings: OpenAI's ``input``, or vLLM's other form, ``messages``
through the chat template (with a vision model, their images too)."""

from __future__ import annotations

from typing import Any, Literal

from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.embedding_encoding import EmbedDType, Endianness
from hetero_infer.server.openai.prompt_field import PromptField, check_prompts, prompt_list
from hetero_infer.server.openai.unsupported_fields import EMBEDDING
from hetero_infer.server.serving.chat_messages import ChatMessage
from hetero_infer.server.serving.request_body import (
    MAX_EMBEDDING_INPUTS,
    JsonObject,
    RequestBody,
)
from pydantic import Field, ValidatorFunctionWrapHandler, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError


class EmbeddingRequest(RequestBody):
    """/v1/embeddings. Any other field is refused, naming it."""

    UNSUPPORTED = EMBEDDING

    model: str | None = None
    # One of the two: input, or messages with the chat template's flags (vLLM's
    # defaults: no generation prompt, no special tokens beyond the template's).
    input: PromptField | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template_kwargs: JsonObject | None = None
    mm_processor_kwargs: JsonObject | None = None
    # vLLM's beside OpenAI's: "bytes" answers in binary, "bytes_only" without its
    # JSON header; base64's and binary's values as embed_dtype in the endianness asked.
    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    embed_dtype: EmbedDType = "float32"
    endianness: Endianness = "native"
    # Accepted only as the model's own size: it has no Matryoshka training, so a
    # shortened vector would not be a meaningful embedding.
    dimensions: int | None = None
    user: str | None = None
    # vLLM's, as on /v1/completions: the special tokens (null: around each text input,
    # not around messages), and each input cut to its last N tokens (-1: to the context).
    add_special_tokens: bool | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    # vLLM's: false leaves the vectors as the model gives them, not scaled to unit length
    # (null: scaled); lower priority first (needs --scheduling-policy priority); and the
    # answer's id made of request_id ("embd-<id>").
    normalize: bool | None = None
    priority: int = 0
    request_id: str | None = Field(default=None, min_length=1, max_length=256)
    # vLLM's: data for a pooling plugin, which its own models (as ours) do not read.
    additional_data: Any = None

    @field_validator("input", mode="wrap")
    @classmethod
    def _valid_inputs(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> PromptField | None:
        if value is None:  # messages instead (_one_form)
            return None
        try:
            value = handler(value)
        except PydanticValidationError:
            # One error naming the field, not one per member of the union it failed.
            raise ValueError(
                "input must be a string, a list of strings, a list of token ids or a list "
                "of lists of token ids"
            ) from None
        value = check_prompts(value, "input")
        if isinstance(value, list) and len(value) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs in one request")
        return value

    @model_validator(mode="after")
    def _one_form(self) -> EmbeddingRequest:
        if (self.input is None) == (self.messages is None):
            raise APIError(400, "give either 'input' or 'messages'", param="input")
        return self

    def inputs(self) -> list[str | list[int]]:
        """The input field as a list of prompts (text or token ids)."""
        assert self.input is not None, "a body of messages has no inputs"
        return prompt_list(self.input)
