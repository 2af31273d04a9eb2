"""/v1/messages/count_tokens: the length of the prompt /v1/messages would build for the
same conversation and tools (rendered by the same template, with the same tools)."""

from __future__ import annotations

from hetero_infer.server.anthropic.chat_translation import chat_plan, image_sources
from hetero_infer.server.anthropic.messages_request import CountTokensRequest
from hetero_infer.server.serving.chat_images import load_images
from hetero_infer.server.serving.request_context import RequestContext


async def count_input_tokens(ctx: RequestContext, body: CountTokensRequest) -> int:
    chat = chat_plan(body)
    images = await load_images(ctx, image_sources(body))
    # What the template sees of the tools, whatever tool_choice says (which decides
    # only how the output is read).
    tools = [tool.for_template() for tool in chat.tools or []]
    token_ids = ctx.chat_prompt(chat.template_messages(), tools=tools or None)
    if not images:
        return len(token_ids)
    processor = ctx.engine.input_processor  # each image counts as the tokens it takes
    return len(processor.with_images(processor.tokenize(token_ids), images).token_ids)
