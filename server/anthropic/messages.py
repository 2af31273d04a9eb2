"""/v1/messages: the body as a ChatPlan (chat_translation.py says how it maps), run as
every family's chat is (serving/chat_run.py), its answer as Anthropic's message object.

The output is read by the same ChatOutputParser as a chat completion's: the server's
reasoning parser makes a ``thinking`` block, the text a ``text`` block, and each tool
call (parsed by the server's --tool-call-parser with tool_choice auto, or made by the
grammar with any / tool) a ``tool_use`` block whose input is the call's arguments.
"""

from __future__ import annotations

import uuid
from typing import Any

from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.server.anthropic.chat_translation import chat_plan, image_sources
from hetero_infer.server.anthropic.messages_request import MessagesRequest, ThinkingEnabled
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.chat_images import load_images
from hetero_infer.server.serving.chat_output import MessageDelta, tool_calls_body
from hetero_infer.server.serving.chat_run import ChatRun
from hetero_infer.server.serving.request_context import RequestContext
from pydantic_core import from_json


class AnthropicMessage:
    """One /v1/messages request: its ChatRun, and the answer."""

    def __init__(self, ctx: RequestContext, run: ChatRun) -> None:
        self.ctx = ctx
        self.run = run
        # The engine (its logs, its aborts) knows the request by the id the client sees.
        self.message_id = run.request.request_id
        self.request = run.request
        self.input_tokens = run.prompt_tokens

    @classmethod
    async def build(cls, ctx: RequestContext, body: MessagesRequest) -> AnthropicMessage:
        """The checked request, its images loaded: a 400 naming the field for what
        cannot be served."""
        if isinstance(body.thinking, ThinkingEnabled) and ctx.settings.reasoning_parser is None:
            raise APIError(
                400,
                "thinking: this server splits thinking from the answer only when started "
                "with --reasoning-parser",
                param="thinking",
            )
        plan = chat_plan(body)
        images = await load_images(ctx, image_sources(body))
        return cls(ctx, ChatRun.build(ctx, plan, new_id("msg"), images))

    async def whole(self) -> dict[str, Any]:
        [[final]] = await self.ctx.run_to_end([self.request])
        parser = self.run.output_parser()
        message = parser.parse(final.text)
        stop_reason, stop_sequence = ending(final, parser.made_calls)
        return message_body(
            self.message_id,
            self.ctx.model_name,
            content_blocks(message),
            stop_reason,
            stop_sequence,
            usage(self.input_tokens, final.num_cached_tokens, len(final.token_ids)),
        )


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, int]:
    """Anthropic's usage, whose input is split by the cache: input_tokens are the
    prompt's tokens not read from it, cache_read_input_tokens those the prefix cache held
    (the two add up to the prompt); nothing is written on request (no cache_control is
    needed: every prompt's blocks are kept as they are computed)."""
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": output_tokens,
    }


def message_body(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    stop_sequence: str | None,
    usage: dict[str, int],
) -> dict[str, Any]:
    """Anthropic's message object (a stream's message_start carries it empty)."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage,
    }


def content_blocks(message: MessageDelta) -> list[dict[str, Any]]:
    """A whole answer's blocks: thinking, text, then one tool_use per call."""
    blocks: list[dict[str, Any]] = []
    if message.reasoning:
        blocks.append(thinking_block(message.reasoning))
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in tool_calls_body(message.tool_calls):
        arguments = call["function"]["arguments"]
        blocks.append(tool_use_block(call["function"]["name"], tool_input(arguments)))
    return blocks


def thinking_block(thinking: str) -> dict[str, Any]:
    # Anthropic signs its thinking so that it can be sent back; nothing here checks it.
    return {"type": "thinking", "thinking": thinking, "signature": ""}


def tool_use_block(name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": new_id("toolu"), "name": name, "input": tool_input}


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the input object. Arguments cut short by max_tokens are
    read as far as they go (as the SDK reads a stream's partial JSON); what is no
    object at all is {}."""
    try:
        value = from_json(arguments, allow_partial="trailing-strings") if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def ending(out: RequestOutput, made_calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished output; the error of a failed one."""
    if out.finish_reason == "error":
        raise constraint_failed()
    # A time limit (timeout, --request-timeout) cuts the output short as max_tokens does.
    if out.finish_reason in ("length", "abort"):
        return "max_tokens", None
    if isinstance(out.stop_reason, str):
        return "stop_sequence", out.stop_reason
    if made_calls:
        return "tool_use", None
    return "end_turn", None


def constraint_failed() -> APIError:
    """The engine ends a request with "error" only where its grammar failed: here the
    tools' (tool_choice any or tool), which compiled and passed its first tokens, then
    met more alternatives at one point than llguidance takes, or forced an input that
    never ends. The request's fault, so a 400 (an ``error`` event once streaming)."""
    return APIError(
        400,
        "the grammar of tool_choice failed during generation: an input_schema has more "
        "alternatives at one point than the grammar engine takes (2000), or forces an "
        "input that never ends",
        param="tools",
    )


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"
