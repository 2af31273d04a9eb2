"""Kubernetes probes.

/healthz (liveness): the process and the engine loop are alive; 200 while the
model loads, 503 once the engine has died. /readyz (readiness): 200 only when the
model is loaded and warmed up and the server is neither draining nor dead.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter()


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    state = request.app.state.server
    if state.is_dead:
        return JSONResponse({"status": "dead"}, status_code=503)
    return JSONResponse({"status": "ok" if state.ready else "loading"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    state = request.app.state.server
    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if state.is_dead:
        return JSONResponse({"status": "dead"}, status_code=503)
    if not state.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ready"})
