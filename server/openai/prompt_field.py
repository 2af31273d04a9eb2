"""The prompt field of /v1/completions, which /v1/embeddings takes as its input."""

from __future__ import annotations

from typing import Annotated

from hetero_infer.server.serving.request_body import TOKEN_ID_SCHEMA, TokenId, check_text
from pydantic import WithJsonSchema

# A prompt as OpenAI takes it: a string, strings, token ids, or lists of token ids.
# None of them empty, which the schema says (the checks are check_prompts' and the
# engine's input processor's).
_TEXT_SCHEMA = {"type": "string", "minLength": 1}
_IDS_SCHEMA = {"type": "array", "items": TOKEN_ID_SCHEMA, "minItems": 1}
PROMPT_SCHEMA = {
    "anyOf": [
        _TEXT_SCHEMA,
        {"type": "array", "items": _TEXT_SCHEMA, "minItems": 1},
        _IDS_SCHEMA,
        {"type": "array", "items": _IDS_SCHEMA, "minItems": 1},
    ]
}
PromptField = Annotated[
    str | list[str] | list[TokenId] | list[list[TokenId]], WithJsonSchema(PROMPT_SCHEMA)
]


def check_prompts(value: PromptField, name: str) -> PromptField:
    """A prompt field is not an empty list, and its texts are valid Unicode."""
    if isinstance(value, list) and not value:
        raise ValueError(f"{name} must not be empty")
    for text in [value] if isinstance(value, str) else value:
        if isinstance(text, str):
            check_text(text)
    return value


def prompt_list(value: PromptField) -> list[str | list[int]]:
    """A prompt field as a list of prompts (text or token ids)."""
    if isinstance(value, str):
        return [value]
    if all(isinstance(x, int) for x in value):
        return [value]  # type: ignore[list-item]
    return list(value)  # type: ignore[arg-type]
