"""POST /reset_prefix_cache: forget every cached block, as vLLM's route of that name does
(RL and evaluation tools call it between runs, so that no run finds the last one's KV).

The reset runs on the engine's thread between steps (AsyncEngine.call) and covers the
device cache and host RAM; the disk tier's files stay, shared with the other replicas
on the machine. Routers that follow the KV events get AllBlocksCleared. While requests
hold blocks nothing is reset and the answer is a 409 (vLLM answers 200 and only logs
that it did not reset): the caller learns to retry once its requests are done. Behind
the API key, as every route that changes the server is.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from hetero_infer.server.errors import APIError

router = APIRouter()


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request) -> Response:
    engine = request.app.state.server.require_engine()
    if not await engine.call(lambda llm: llm.core.reset_prefix_cache()):
        raise APIError(
            409,
            "the prefix cache cannot be reset while requests hold KV blocks: retry once "
            "they finish",
            code="prefix_cache_in_use",
        )
    return Response(status_code=200)
