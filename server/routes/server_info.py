"""GET /server_info: the served model's name, where SGLang's router looks for it; and
GET /version, this server's version, in vLLM's shape.

sglang-router (docs/deployment.md, "Replicas behind a router") asks each replica for
SGLang's /server_info when it registers it, and takes `served_model_name` as the replica's
model: the id its own /v1/models lists. Without this route it registers the model as
"unknown". Only that field is given: the router reads others of SGLang's (model_path
to load a tokenizer, dp_size to address data-parallel ranks) that would mean something
else here, and falls back well without them. Open without the API key, as /health is:
the router registers replicas before any client's key reaches it.
"""

from __future__ import annotations

from importlib import metadata

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter()
# The installed package's version, read once: it cannot change while the server runs.
VERSION = metadata.version("hetero-paged-infer")


@router.get("/server_info")
async def server_info(request: Request) -> JSONResponse:
    settings = request.app.state.server.settings
    return JSONResponse({"served_model_name": settings.model_name})


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": VERSION})
