"""An Anthropic body as a ChatPlan (serving/chat_plan.py), the chat request every
family makes, so that one piece of code renders the template, builds the tools' grammar
and parses the output for every API.

- ``system`` becomes a system message first;
- an assistant turn's text and tool_use blocks become one assistant message with
  ``tool_calls`` (the input as the arguments' JSON);
- a user turn's tool_result blocks become ``tool`` messages (``tool_call_id``, and the
  tool's name where an earlier tool_use gives it), then its text a user message (with
  its image blocks, as image_url parts among the text in the turn's order);
- tools become functions (input_schema -> parameters); tool_choice auto / any / tool /
  none becomes "auto" / "required" / the named function / "none", and
  ``disable_parallel_tool_use`` becomes ``parallel_tool_calls: false``;
- stop_sequences become ``stop``; the sampling fields keep their names.
"""

from __future__ import annotations

import json
from typing import Any

from hetero_infer.server.anthropic.messages_request import (
    ConversationFields,
    ImageBlock,
    InputMessage,
    MessagesRequest,
    TextBlock,
    ThinkingEnabled,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
)
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.chat_images import ImageSource, image_url_part
from hetero_infer.server.serving.chat_plan import ChatPlan
from pydantic import ValidationError as PydanticValidationError


def chat_plan(body: ConversationFields) -> ChatPlan:
    """The chat request that ``body`` asks for. (The Anthropic body was checked
    already; what the ChatPlan checks beyond it is a 400 too.)"""
    values: dict[str, Any] = {"model": body.model, "messages": chat_messages(body)}
    if body.tools:
        values["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.input_schema,
                },
            }
            for tool in body.tools
        ]
    if body.tool_choice is not None:
        values["tool_choice"] = _tool_choice(body.tool_choice)
        if body.tool_choice.disable_parallel_tool_use:
            values["parallel_tool_calls"] = False
    if isinstance(body, MessagesRequest):
        values |= {
            "max_tokens": body.max_tokens,
            "stop": body.stop_sequences,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
            "stream": body.stream,
        }
        thinking = body.thinking
        if thinking is not None:
            enabled = isinstance(thinking, ThinkingEnabled)
            values["chat_template_kwargs"] = {"enable_thinking": enabled}
            if isinstance(thinking, ThinkingEnabled):
                values["thinking_token_budget"] = thinking.budget_tokens
    try:
        return ChatPlan.model_validate(values)
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise APIError(400, f"{where}: {first['msg']}" if where else first["msg"]) from None


def chat_messages(body: ConversationFields) -> list[dict[str, Any]]:
    """The conversation as chat messages (OpenAI's shape: ChatMessage's)."""
    messages: list[dict[str, Any]] = []
    system = body.system_text()
    if system is not None:
        messages.append({"role": "system", "content": system})
    tool_names: dict[str, str] = {}  # tool_use id -> the tool's name
    for message in body.messages:
        messages += _turn(message, tool_names)
    return messages


def _turn(message: InputMessage, tool_names: dict[str, str]) -> list[dict[str, Any]]:
    blocks = message.blocks()
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    if message.role == "assistant":
        calls = [b for b in blocks if isinstance(b, ToolUseBlock)]
        tool_names.update((call.id, call.name) for call in calls)
        entry: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            entry["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.input)},
                }
                for call in calls
            ]
        return [entry]
    out: list[dict[str, Any]] = []
    for result in (b for b in blocks if isinstance(b, ToolResultBlock)):
        tool = {"role": "tool", "tool_call_id": result.tool_use_id, "content": result.text()}
        if result.tool_use_id in tool_names:
            tool["name"] = tool_names[result.tool_use_id]
        out.append(tool)
    if any(isinstance(b, ImageBlock) for b in blocks):
        # Text and images in the turn's order: where the template writes each image.
        parts = [
            image_url_part(b.url())
            if isinstance(b, ImageBlock)
            else {"type": "text", "text": b.text}
            for b in blocks
            if isinstance(b, TextBlock | ImageBlock)
        ]
        out.append({"role": "user", "content": parts})
    elif text or len(out) == 0:  # a turn of tool results only has no user message
        out.append({"role": "user", "content": text})
    return out


def image_sources(body: ConversationFields) -> list[ImageSource]:
    """The user turns' images, in the order the chat messages hold them."""
    return [
        ImageSource(block.url(), f"messages.{i}.content.{j}")
        for i, message in enumerate(body.messages)
        for j, block in enumerate(message.content)
        if isinstance(block, ImageBlock)
    ]


def _tool_choice(choice: ToolChoice) -> str | dict[str, Any]:
    if choice.type == "any":
        return "required"
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.type  # "auto", "none"
