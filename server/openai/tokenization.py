"""/tokenize and /detokenize, as in vLLM: the model's tokenizer over HTTP."""

from __future__ import annotations

from typing import Any

from hetero_infer.engine.async_engine import AsyncEngine
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.chat_request import template_messages
from hetero_infer.server.openai.serving import chat_prompt
from hetero_infer.server.openai.tokenize_request import DetokenizeRequest, TokenizeRequest


def tokenize(
    engine: AsyncEngine, body: TokenizeRequest, chat_template: str | None = None
) -> dict[str, Any]:
    """The tokens of a prompt, or of messages through the chat template (the server's
    --chat-template where it has one)."""
    if body.messages is not None:
        tokens = chat_prompt(engine, template_messages(body.messages), chat_template=chat_template)
    elif body.prompt is not None:
        tokens = engine.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        raise APIError(400, "give 'prompt' or 'messages'", param="prompt")
    return {"tokens": tokens, "count": len(tokens), "max_model_len": engine.max_model_len}


def detokenize(engine: AsyncEngine, body: DetokenizeRequest) -> dict[str, Any]:
    vocab = engine.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
    return {"prompt": engine.tokenizer.decode(body.tokens)}
