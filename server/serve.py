"""Running the server under uvicorn, with a draining shutdown on SIGTERM.

On the first SIGTERM (or Ctrl-C) readiness turns 503 and new requests get 503
while the socket stays open; in-flight requests and streams finish (up to
``shutdown_timeout``), then uvicorn stops and the process exits 0. A second
signal stops at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import uvicorn
from hetero_infer.server.app import build_app
from hetero_infer.server.settings import ServerSettings
from sse_starlette.sse import AppStatus

logger = logging.getLogger(__name__)


def serve(settings: ServerSettings) -> None:
    logger.info("settings: %s", json.dumps(settings.redacted()))
    # sse-starlette would cut every stream on SIGTERM; we drain them instead.
    AppStatus.disable_automatic_graceful_drain()
    app = build_app(settings)
    state = app.state.server
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        timeout_graceful_shutdown=max(1, int(settings.shutdown_timeout)),
    )
    server = uvicorn.Server(config)
    stop_now = server.handle_exit

    def on_signal(sig, frame) -> None:
        if state.draining:
            stop_now(sig, frame)
            return
        logger.info(
            "draining: finishing %d requests", state.engine.num_pending if state.engine else 0
        )
        state.draining = True
        asyncio.get_event_loop().call_soon_threadsafe(
            lambda: asyncio.ensure_future(_drain(state, server, settings.shutdown_timeout))
        )

    server.handle_exit = on_signal
    server.run()


async def _drain(state, server: uvicorn.Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while state.engine is not None and state.engine.num_pending and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # let the last stream chunks flush
    server.should_exit = True
