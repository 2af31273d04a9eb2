"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/responses,
/v1/embeddings, /v1/models (and one model's card, /v1/models/{model}), /tokenize and
/detokenize; vLLM's /v1/score and /rerank (/v1/rerank); and SageMaker's /invocations,
which takes any of their bodies.

Each handler only routes: completions.py, chat.py, responses_api.py and embeddings.py
build the engine requests (through the engine's input processor, which checks them)
and the answers, whole or streamed as SSE. The typed bodies (*_request.py) and answers
(answers.py, responses_api_answers.py) are what the app's OpenAPI schema describes.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai import tokenization
from hetero_infer.server.openai.answers import (
    ChatCompletionResponse,
    CompletionResponse,
    DetokenizeResponse,
    EmbeddingResponse,
    ModelCard,
    ModelList,
    RerankResponse,
    ScoreResponse,
    TokenizeResponse,
    route_responses,
)
from hetero_infer.server.openai.chat import ChatCompletion
from hetero_infer.server.openai.chat_request import ChatCompletionRequest
from hetero_infer.server.openai.completion_request import CompletionRequest
from hetero_infer.server.openai.completions import Completion
from hetero_infer.server.openai.embedding_request import EmbeddingRequest
from hetero_infer.server.openai.embeddings import Embeddings
from hetero_infer.server.openai.models import model_list
from hetero_infer.server.openai.responses import respond
from hetero_infer.server.openai.responses_api import (
    ResponsesAnswer,
    deleted_response,
    stored_response,
)
from hetero_infer.server.openai.responses_api_answers import DeletedResponse, ResponseObject
from hetero_infer.server.openai.responses_api_request import ResponsesRequest
from hetero_infer.server.openai.responses_api_stream import respond_events
from hetero_infer.server.openai.scoring import rerank, score
from hetero_infer.server.openai.scoring_request import RerankRequest, ScoreRequest
from hetero_infer.server.openai.tokenize_request import DetokenizeRequest, TokenizeRequest
from hetero_infer.server.serving.request_context import RequestContext, unknown_model
from pydantic import ValidationError as PydanticValidationError

router = APIRouter()


@router.post("/v1/completions", responses=route_responses(CompletionResponse, streams=True))
async def completions(body: CompletionRequest, request: Request) -> Response:
    completion = Completion.build(RequestContext.open(request, body.model), body)
    return await respond(completion, body.stream)


@router.post(
    "/v1/chat/completions", responses=route_responses(ChatCompletionResponse, streams=True)
)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    chat = await ChatCompletion.build(RequestContext.open(request, body.model), body)
    return await respond(chat, body.stream)


@router.post("/v1/responses", responses=route_responses(ResponseObject, streams=True))
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    store = request.app.state.server.responses
    answer = await ResponsesAnswer.build(RequestContext.open(request, body.model), body, store)
    return await respond_events(answer, body.stream)


@router.get("/v1/responses/{response_id}", responses=route_responses(ResponseObject))
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    return stored_response(request.app.state.server.responses, response_id)


@router.delete("/v1/responses/{response_id}", responses=route_responses(DeletedResponse))
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    return deleted_response(request.app.state.server.responses, response_id)


@router.post("/v1/embeddings", responses=route_responses(EmbeddingResponse, binary=True))
async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    answer = await Embeddings.build(RequestContext.open(request, body.model), body)
    return await answer.response()


@router.post("/v1/score", responses=route_responses(ScoreResponse))
@router.post("/score", responses=route_responses(ScoreResponse), include_in_schema=False)
async def scores(body: ScoreRequest, request: Request) -> dict[str, Any]:
    return await score(RequestContext.open(request, body.model), body)


@router.post("/v1/rerank", responses=route_responses(RerankResponse))
@router.post("/rerank", responses=route_responses(RerankResponse), include_in_schema=False)
# Cohere's v2 client's path, which vLLM serves too.
@router.post("/v2/rerank", responses=route_responses(RerankResponse), include_in_schema=False)
async def reranked(body: RerankRequest, request: Request) -> dict[str, Any]:
    return await rerank(RequestContext.open(request, body.model), body)


@router.get("/v1/models", responses=route_responses(ModelList))
async def models(request: Request) -> dict[str, Any]:
    state = request.app.state.server
    engine = state.engine
    adapters = None
    if engine is not None and engine.lora is not None:
        adapters = [(a.name, a.path) for a in engine.lora.adapters]
    return model_list(state.settings, engine.max_model_len if engine else None, adapters)


# OpenAI's "retrieve model" (the SDKs' models.retrieve): a listed name's card, else a 404.
# A path, since hub ids have a slash (Qwen/Qwen2.5-0.5B-Instruct).
@router.get("/v1/models/{model:path}", responses=route_responses(ModelCard))
async def model(model: str, request: Request) -> dict[str, Any]:
    for card in (await models(request))["data"]:
        if card["id"] == model:
            return card
    raise unknown_model(model)


@router.post("/tokenize", responses=route_responses(TokenizeResponse))
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    ctx = RequestContext.open(request, body.model)
    return await tokenization.tokenize(ctx, body)


@router.post("/detokenize", responses=route_responses(DetokenizeResponse))
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    return tokenization.detokenize(RequestContext.open(request, body.model).engine, body)


# SageMaker's one inference path (its containers are probed at /ping and called at
# /invocations): the body goes to the route whose body it is, by the field only that
# body has, as vLLM routes it.
INVOCATIONS = (
    ("messages", ChatCompletionRequest, chat_completions),
    ("prompt", CompletionRequest, completions),
    ("input", EmbeddingRequest, embeddings),
    ("query", RerankRequest, reranked),
    ("text_1", ScoreRequest, scores),
)


@router.post("/invocations", include_in_schema=False)
async def invocations(request: Request) -> Any:
    try:
        body = json.loads(await request.body())
    except (ValueError, RecursionError):
        raise APIError(400, "the request body is not valid JSON") from None
    for field, model_type, route in INVOCATIONS:
        if isinstance(body, dict) and field in body:
            try:
                parsed = model_type.model_validate(body)
            except PydanticValidationError as exc:
                raise RequestValidationError(exc.errors()) from None
            return await route(parsed, request)
    fields = ", ".join(f"'{field}'" for field, _, _ in INVOCATIONS)
    raise APIError(400, f"/invocations takes the body of a chat, completion, embedding, "
                   f"rerank or score request: one with {fields}")  # fmt: skip
