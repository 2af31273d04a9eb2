"""The prompt of OpenAI-shaped messages where no chat run is made of them: /tokenize
counts it and /v1/embeddings embeds it, as the chat route would build it (the template
and its flags, the tools, each image grown into its tokens)."""

from __future__ import annotations

from typing import Any, Protocol

from hetero_infer.engine.frontend.input_processor import PromptTokens
from hetero_infer.server.serving.chat_images import image_sources, load_images
from hetero_infer.server.serving.chat_messages import ChatMessage, template_messages
from hetero_infer.server.serving.chat_plan import check_template_flags
from hetero_infer.server.serving.request_context import RequestContext


class MessagesBody(Protocol):
    """A body that gives messages with vLLM's chat template fields."""

    add_generation_prompt: bool
    continue_final_message: bool
    # The tokenizer's special tokens around the templated prompt (null: none).
    add_special_tokens: bool | None
    chat_template_kwargs: dict[str, Any] | None
    # The image processor's settings over the server's (vLLM's per-request field).
    mm_processor_kwargs: dict[str, Any] | None


async def messages_prompt(
    ctx: RequestContext,
    messages: list[ChatMessage],
    body: MessagesBody,
    tools: list[dict[str, Any]] | None = None,
) -> PromptTokens:
    """The checked prompt; a 400 for template flags that cannot hold, or images the
    model cannot take (before any is fetched)."""
    check_template_flags(messages, body.add_generation_prompt, body.continue_final_message)
    images = await load_images(ctx, image_sources(messages), body.mm_processor_kwargs)
    token_ids = ctx.chat_prompt(
        template_messages(messages),
        tools=tools or None,
        template_kwargs=body.chat_template_kwargs,
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
        add_special_tokens=bool(body.add_special_tokens),
    )
    processor = ctx.engine.input_processor
    return processor.with_images(processor.tokenize(token_ids, param="messages"), images)
