"""/tokenize and /detokenize, as in vLLM: the model's tokenizer over HTTP."""

from __future__ import annotations

from typing import Any

from hetero_infer.engine.entrypoints.async_engine import AsyncEngine
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.tokenize_request import DetokenizeRequest, TokenizeRequest
from hetero_infer.server.serving.messages_prompt import messages_prompt
from hetero_infer.server.serving.request_context import RequestContext


async def tokenize(ctx: RequestContext, body: TokenizeRequest) -> dict[str, Any]:
    """The tokens of a prompt, or of messages (with their tools) through the chat
    template, as a chat request would have them (each image grown into its tokens)."""
    engine = ctx.engine
    if body.messages is not None:
        tools = [tool.for_template() for tool in body.tools or []]
        tokens = (await messages_prompt(ctx, body.messages, body, tools)).token_ids
    elif body.prompt is not None:
        special = body.add_special_tokens is not False
        tokens = engine.tokenizer.encode(body.prompt, add_special_tokens=special)
    else:
        raise APIError(400, "give 'prompt' or 'messages'", param="prompt")
    strings = engine.tokenizer.token_strings(tokens) if body.return_token_strs else None
    return {
        "tokens": tokens,
        "count": len(tokens),
        "max_model_len": engine.max_model_len,
        "token_strs": strings,
    }


def detokenize(engine: AsyncEngine, body: DetokenizeRequest) -> dict[str, Any]:
    vocab = engine.model_config.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
    return {"prompt": engine.tokenizer.decode(body.tokens)}
