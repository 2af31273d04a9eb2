"""Running the server process: its port, the checks before it listens, uvicorn, and
how it stops.

In order: the port is taken first (a port in use ends the process before anything
loads); then what can be known of the engine without loading its weights is checked
(the model's files, its architecture, the memory it asks for: engine/setup.py); only
then does the socket listen, with the model loading behind it (/healthz answers
meanwhile). Each of these failures ends the process with status 1 and a one-line
``error:`` as the last thing it prints, so a supervisor (Kubernetes, systemd) shows a
crash with its reason rather than a server that is never ready. An engine that fails
to load after the socket listens ends it the same way.

On the first SIGTERM (or Ctrl-C) readiness turns 503 and new requests get 503 while
the socket stays open; in-flight requests and streams finish, for up to
``shutdown_timeout`` seconds. Those still running then end with an error (a stream
with an ``error`` event and ``[DONE]``), and the process exits 0. A second signal
stops at once: the requests in flight end with that error too, and the process exits
without waiting for them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from types import FrameType

import uvicorn
from hetero_infer.engine.setup import resolve_setup
from hetero_infer.server.app import ServerState, build_app, log_start_failure, start_failure
from hetero_infer.server.errors import service_unavailable
from hetero_infer.server.settings import ServerSettings
from sse_starlette.sse import AppStatus

logger = logging.getLogger(__name__)

# What uvicorn itself waits, once the drain has ended every request, for the last
# chunks to flush and idle connections to close. The drain (shutdown_timeout) is the
# one long wait: uvicorn's own wait after it doubled the time a stop could take.
FLUSH_SECONDS = 1.0


def serve(settings: ServerSettings, listener: socket.socket) -> int:
    """Serve on ``listener`` (bound to the settings' host and port: listen.py) until
    stopped; the process's exit status."""
    logger.info("settings: %s", json.dumps(settings.redacted()))
    try:
        resolve_setup(settings.engine)  # the model's files, architecture and memory
    except Exception as exc:
        listener.close()
        log_start_failure(exc)
        return _fail(start_failure(exc))
    # sse-starlette would cut every stream on SIGTERM; we drain them instead.
    AppStatus.disable_automatic_graceful_drain()
    app = build_app(settings)
    state: ServerState = app.state.server
    config = uvicorn.Config(
        app,
        log_level="info",
        # The app logs every request once, with its request id (server/middleware.py).
        access_log=False,
        timeout_graceful_shutdown=FLUSH_SECONDS,
    )
    server = uvicorn.Server(config)
    stop = Stop(state, server, settings.shutdown_timeout)
    server.handle_exit = stop.on_signal
    state.stop_process = stop.engine_failed
    logger.info("listening on http://%s:%d", settings.host, settings.port)
    server.run(sockets=[listener])
    if stop.forced_by is not None:
        # Threads still busy (a model half loaded, a step) are not waited for.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + stop.forced_by)
    if state.load_error is not None:
        return _fail(start_failure(state.load_error))
    return 0


def _fail(reason: str) -> int:
    print(f"error: {reason}", file=sys.stderr, flush=True)
    return 1


class Stop:
    """How the server stops: on a signal (a drain, then a second signal at once), or
    when its engine fails to start."""

    def __init__(self, state: ServerState, server: uvicorn.Server, drain_seconds: float) -> None:
        self.state = state
        self.server = server
        self.drain_seconds = drain_seconds
        self.forced_by: int | None = None  # the signal that stopped the process at once

    def on_signal(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's signal handler (SIGINT, SIGTERM), on the main thread."""
        loop = asyncio.get_event_loop()
        if self.state.draining:
            logger.warning("stopping at once (%s)", signal.Signals(sig).name)
            self.forced_by = sig
            loop.call_soon_threadsafe(self._end_requests, "the server stopped")
            # Only the error events' flush is waited for (uvicorn's force_exit would
            # also skip the app's shutdown, its lifespan then cancelled with a traceback).
            self.server.config.timeout_graceful_shutdown = 0.2
            self.server.should_exit = True
            return
        engine = self.state.engine
        logger.info(
            "draining: finishing %d requests, for up to %g s (a second signal stops at once)",
            engine.num_pending if engine else 0,
            self.drain_seconds,
        )
        self.state.draining = True
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    def engine_failed(self) -> None:
        """The engine could not start: the process ends (serve says why)."""
        self.server.should_exit = True

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_seconds
        while self._pending() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._pending():
            logger.warning(
                "shutdown_timeout (%g s) passed with %d requests unfinished: ending them",
                self.drain_seconds,
                self._pending(),
            )
            self._end_requests(f"the server shut down ({self.drain_seconds:g} s after a signal)")
            # Each ends as its response reads the error: at once, unless its client is
            # slow to read (then uvicorn's own wait, FLUSH_SECONDS, is its last chance).
            deadline = time.monotonic() + FLUSH_SECONDS
            while self._pending() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # let the last chunks flush
        self.server.should_exit = True

    def _pending(self) -> int:
        engine = self.state.engine
        return engine.num_pending if engine is not None else 0

    def _end_requests(self, why: str) -> None:
        """Every request in flight ends with a 503 (streams: an in-band error event)."""
        if self.state.engine is not None:
            self.state.engine.end_all(service_unavailable(f"{why} before the request finished"))
