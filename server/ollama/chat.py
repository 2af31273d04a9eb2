"""/api/chat: Ollama's messages and tools become a ChatPlan (serving/chat_plan.py),
which the chat template renders and whose tool calls are read as in every family's chat.

Tools are called as the model decides (OpenAI's tool_choice "auto"), so they need the
server started with --enable-auto-tool-choice and --tool-call-parser. A tool message
answers the call it names by tool_call_id, else the earliest unanswered call of its
tool_name.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from hetero_infer.engine.multimodal.recent_images import PreparedImage
from hetero_infer.server.errors import APIError
from hetero_infer.server.ollama.generation import Generation
from hetero_infer.server.ollama.request_bodies import ChatRequest, OllamaMessage
from hetero_infer.server.ollama.sampling import engine_request, sampling_values, validated
from hetero_infer.server.ollama.thinking import thinking
from hetero_infer.server.serving.chat_images import ImageSource, image_url_part
from hetero_infer.server.serving.chat_output import ChatOutputParser
from hetero_infer.server.serving.chat_plan import ChatPlan
from hetero_infer.server.serving.reasoning import reasoning_parser
from hetero_infer.server.serving.request_context import RequestContext
from hetero_infer.server.serving.tool_use import tool_use


def build_chat(
    ctx: RequestContext, body: ChatRequest, model: str, images: Sequence[PreparedImage] = ()
) -> Generation:
    """``images``: the messages' (image_sources), loaded."""
    start = time.monotonic()
    settings = ctx.settings
    if body.tools and not settings.enable_auto_tool_choice:
        raise APIError(
            400,
            "tools: this server reads tool calls only when started with "
            "--enable-auto-tool-choice and --tool-call-parser",
            param="tools",
        )
    reasoning, template_kwargs = thinking(body, settings)
    tools = body.tools and [tool.model_dump(exclude_none=True) for tool in body.tools]
    chat = validated(
        ChatPlan,
        {
            "messages": openai_messages(body.messages),
            "tools": tools or None,
            "chat_template_kwargs": template_kwargs or None,
            **sampling_values(body),
        },
    )
    use = tool_use(chat, settings)
    messages = chat.template_messages()
    for message, given in zip(messages, body.messages, strict=True):
        if given.thinking:
            message["reasoning_content"] = given.thinking
    token_ids = ctx.chat_prompt(
        messages, tools=use.template_tools, template_kwargs=chat.chat_template_kwargs
    )
    processor = ctx.engine.input_processor
    # Images grow into their tokens before num_predict is fitted to what is left.
    prompt = processor.with_images(processor.tokenize(token_ids), images)
    request = engine_request(ctx, body, chat, prompt, use.keeps_special_tokens)

    def new_parser() -> ChatOutputParser:
        tool_parser = use.new_parser() if use.new_parser else None
        return ChatOutputParser(
            reasoning_parser(reasoning) if reasoning else None, tool_parser, use.max_calls
        )

    top_logprobs = body.top_logprobs_count()
    return Generation(
        ctx,
        request,
        model,
        new_parser,
        chat=True,
        returns_context=False,
        top_logprobs=top_logprobs,
        start=start,
    )


def openai_messages(messages: list[OllamaMessage]) -> list[dict[str, Any]]:
    """Ollama's messages in OpenAI's shape (ChatMessage's): each call gets an id (its
    own, or one made up), arguments as JSON text; each tool message the id of the call
    it answers."""
    unanswered: list[tuple[str, str]] = []  # (call id, function name), oldest first
    converted = []
    for i, message in enumerate(messages):
        entry: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.images:
            # The images first, then the text, as Ollama lays out a message's images.
            parts = [image_url_part(source.url) for source in _images(message, i)]
            text = [{"type": "text", "text": message.content}] if message.content else []
            entry["content"] = [*parts, *text]
        if message.tool_calls:
            entry["tool_calls"] = []
            for j, call in enumerate(message.tool_calls):
                call_id = call.id or f"call_{i}_{j}"
                unanswered.append((call_id, call.function.name))
                function = {
                    "name": call.function.name,
                    "arguments": json.dumps(call.function.arguments),
                }
                entry["tool_calls"].append(
                    {"id": call_id, "type": "function", "function": function}
                )
        if message.role == "tool":
            entry["tool_call_id"] = _answered(unanswered, message) or f"call_{i}"
            if message.tool_name:
                entry["name"] = message.tool_name
        converted.append(entry)
    return converted


def image_sources(messages: list[OllamaMessage]) -> list[ImageSource]:
    """The messages' images, in order (a 400 for images outside a user's message)."""
    return [source for i, message in enumerate(messages) for source in _images(message, i)]


def _images(message: OllamaMessage, index: int) -> list[ImageSource]:
    if message.images and message.role != "user":
        where = f"messages.{index}.images"
        raise APIError(400, f"{where}: only a user message may hold images", param=where)
    return [
        ImageSource(f"data:;base64,{image}", f"messages.{index}.images.{k}")
        for k, image in enumerate(message.images or [])
    ]


def _answered(unanswered: list[tuple[str, str]], message: OllamaMessage) -> str | None:
    for k, (call_id, name) in enumerate(unanswered):
        if call_id == message.tool_call_id or (
            message.tool_call_id is None and name == message.tool_name
        ):
            del unanswered[k]
            return call_id
    return message.tool_call_id
