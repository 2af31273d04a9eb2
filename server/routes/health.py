"""Kubernetes probes, and vLLM's health check for load balancers.

/healthz (liveness): the process and the engine loop are alive; 200 while the
model loads, 503 once the engine has died. /readyz (readiness): 200 only when the
model is loaded and warmed up and the server is neither draining nor dead.
/health: vLLM's name, which routers (sglang-router, vllm-router) and other load
balancers probe before they send a replica traffic. vLLM opens its port only once
the model is loaded, so its 200 there means "ready"; this server listens while it
loads, so /health answers as /readyz does, with vLLM's empty 200 body. /ready is
/readyz by the name llm-d's inference simulator gives it. /ping (GET or POST) is
/health by the name SageMaker's containers are probed at, which vLLM, SGLang and TGI
answer too.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

router = APIRouter()


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    state = request.app.state.server
    if state.is_dead:
        return JSONResponse({"status": "dead"}, status_code=503)
    return JSONResponse({"status": "ok" if state.ready else "loading"})


def _not_ready(request: Request) -> JSONResponse | None:
    """Why the server should get no new requests now, as a 503; None when it should."""
    state = request.app.state.server
    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if state.is_dead:
        return JSONResponse({"status": "dead"}, status_code=503)
    if not state.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    return None


@router.get("/readyz")
@router.get("/ready")  # llm-d's simulator's name for it
async def readyz(request: Request) -> JSONResponse:
    return _not_ready(request) or JSONResponse({"status": "ready"})


@router.get("/health")
@router.get("/ping")
@router.post("/ping")
async def health(request: Request) -> Response:
    # A draining replica answers 503 too, so a router stops sending it new requests
    # while it finishes the ones it has.
    return _not_ready(request) or Response(status_code=200)
