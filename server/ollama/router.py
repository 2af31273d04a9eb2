"""Ollama's API: /api/chat, /api/generate, /api/embed (and the older /api/embeddings),
/api/tags, /api/show, /api/ps and /api/version, on the engine the OpenAI routes serve.

Each handler only routes: chat.py, generate.py and embed.py build the engine requests
(through the OpenAI routes' template, tool, sampling and schema code and the engine's
input processor), generation.py the answers, ndjson.py the streams. Errors come in
Ollama's shape (errors.py). GET / stays the chat page (server/routes/ui.py), so the
"Ollama is running" probe Ollama answers there is not served.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from hetero_infer.server.ollama import models
from hetero_infer.server.ollama.answers import (
    ChatAnswer,
    EmbedAnswer,
    EmbeddingsAnswer,
    GenerateAnswer,
    RunningList,
    ShowAnswer,
    TagList,
    VersionAnswer,
    ollama_responses,
)
from hetero_infer.server.ollama.chat import build_chat
from hetero_infer.server.ollama.chat import image_sources as chat_images
from hetero_infer.server.ollama.embed import embed, embeddings
from hetero_infer.server.ollama.errors import OllamaRoute
from hetero_infer.server.ollama.generate import build_generate, own_template
from hetero_infer.server.ollama.generate import image_sources as generate_images
from hetero_infer.server.ollama.generation import load_answer
from hetero_infer.server.ollama.names import check_model_name
from hetero_infer.server.ollama.ndjson import respond
from hetero_infer.server.ollama.request_bodies import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    ShowRequest,
)
from hetero_infer.server.serving.chat_images import load_images
from hetero_infer.server.serving.request_context import RequestContext

router = APIRouter(route_class=OllamaRoute, tags=["ollama"])


def _open(request: Request, model: str) -> RequestContext:
    """The request's context: 404 for a name not served, 503 while not serving."""
    check_model_name(request.app.state.server.settings, model)
    return RequestContext.open(request, None)


@router.post("/api/chat", responses=ollama_responses(ChatAnswer, streams=True))
async def chat(body: ChatRequest, request: Request) -> Response:
    ctx = _open(request, body.model)
    if not body.messages:
        return JSONResponse(load_answer(body.model, chat=True))
    images = await load_images(ctx, chat_images(body.messages))
    return await respond(build_chat(ctx, body, body.model, images), body.stream)


@router.post("/api/generate", responses=ollama_responses(GenerateAnswer, streams=True))
async def generate(body: GenerateRequest, request: Request) -> Response:
    ctx = _open(request, body.model)
    if not body.prompt and not body.context:
        return JSONResponse(load_answer(body.model, chat=False))
    images = await load_images(ctx, generate_images(body))
    return await respond(build_generate(ctx, body, body.model, images), body.stream)


@router.post("/api/embed", responses=ollama_responses(EmbedAnswer))
async def embed_route(body: EmbedRequest, request: Request) -> Response:
    ctx = _open(request, body.model)
    return JSONResponse(await embed(ctx, body, body.model))


@router.post("/api/embeddings", responses=ollama_responses(EmbeddingsAnswer))
async def embeddings_route(body: EmbeddingsRequest, request: Request) -> Response:
    ctx = _open(request, body.model)
    return JSONResponse(await embeddings(ctx, body))


@router.get("/api/tags", responses=ollama_responses(TagList))
async def tags(request: Request) -> dict[str, Any]:
    state = request.app.state.server
    return models.tags(state.settings, state.require_engine())


@router.get("/api/ps", responses=ollama_responses(RunningList))
async def ps(request: Request) -> dict[str, Any]:
    state = request.app.state.server
    return models.running(state.settings, state.require_engine())


@router.post("/api/show", responses=ollama_responses(ShowAnswer))
async def show(body: ShowRequest, request: Request) -> dict[str, Any]:
    ctx = _open(request, body.model_name())
    return models.show(ctx.settings, ctx.engine, own_template(ctx))


@router.get("/api/version", responses=ollama_responses(VersionAnswer))
async def version() -> dict[str, str]:
    return models.version()
