"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

Each handler only routes: messages.py builds the request and the answer,
messages_stream.py the event stream, count_tokens.py the count. Every error on these
routes is in Anthropic's shape (errors.py); ``anthropic-version`` and
``anthropic-beta`` headers are accepted and change nothing.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from hetero_infer.server.anthropic.answers import (
    CountTokensResponse,
    MessageResponse,
    route_responses,
)
from hetero_infer.server.anthropic.count_tokens import count_input_tokens
from hetero_infer.server.anthropic.errors import AnthropicRoute
from hetero_infer.server.anthropic.messages import AnthropicMessage
from hetero_infer.server.anthropic.messages_request import CountTokensRequest, MessagesRequest
from hetero_infer.server.anthropic.messages_stream import respond
from hetero_infer.server.serving.request_context import RequestContext

router = APIRouter(route_class=AnthropicRoute, tags=["anthropic"])


@router.post("/v1/messages", responses=route_responses(MessageResponse, streams=True))
async def messages(body: MessagesRequest, request: Request) -> Response:
    message = await AnthropicMessage.build(RequestContext.open(request, body.model), body)
    return await respond(message, body.stream)


@router.post("/v1/messages/count_tokens", responses=route_responses(CountTokensResponse))
async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, Any]:
    ctx = RequestContext.open(request, body.model)
    return {"input_tokens": await count_input_tokens(ctx, body)}
