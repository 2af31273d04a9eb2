"""GET /metrics: Prometheus text exposition."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry = request.app.state.server.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
