"""build_app(): the FastAPI application. Its lifespan owns the engine.

The model loads in a background thread after the socket opens, so /healthz
answers (200) while loading and /readyz turns 200 only once the engine has
loaded and served a warm-up request. An engine that cannot start leaves /healthz at
503; a server process (serve.py) then exits, saying why.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI
from hetero_infer.engine.entrypoints.async_engine import AsyncEngine
from hetero_infer.engine.entrypoints.llm_engine import LLMEngine
from hetero_infer.engine.params.sampling_params import SamplingParams
from hetero_infer.server import middleware
from hetero_infer.server.anthropic.router import router as anthropic_router
from hetero_infer.server.errors import install_error_handlers, service_unavailable
from hetero_infer.server.ollama.router import router as ollama_router
from hetero_infer.server.openai.lora import router as lora_router
from hetero_infer.server.openai.responses_api_store import ResponseStore
from hetero_infer.server.openai.router import router as openai_router
from hetero_infer.server.routes import health, metrics, prefix_cache, server_info, ui
from hetero_infer.server.server_metrics import ServerMetrics
from hetero_infer.server.settings import ServerSettings

logger = logging.getLogger(__name__)


@dataclass
class ServerState:
    settings: ServerSettings
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    # /v1/responses' stored responses (previous_response_id, GET /v1/responses/{id}).
    responses: ResponseStore = field(default_factory=ResponseStore)
    engine: AsyncEngine | None = None
    ready: bool = False
    draining: bool = False
    load_error: BaseException | None = None
    # How a server process ends once its engine has failed to start (serve.py); an
    # app embedded elsewhere (None) keeps answering 503.
    stop_process: Callable[[], None] | None = None

    @property
    def is_dead(self) -> bool:
        """The engine failed to load, or its loop has died."""
        return self.load_error is not None or (
            self.engine is not None and self.engine.dead_error is not None
        )

    def require_engine(self) -> AsyncEngine:
        """The engine if it can take a request now; otherwise a 503 to send back."""
        if self.draining:
            raise service_unavailable("the server is shutting down")
        if self.is_dead:
            raise service_unavailable("the engine has failed")
        if self.engine is None or not self.ready:
            raise service_unavailable("the model is still loading")
        return self.engine


def build_app(settings: ServerSettings, engine: LLMEngine | None = None) -> FastAPI:
    """The app; ``engine`` lets tests and embedders pass a loaded engine."""
    state = ServerState(settings)
    state.metrics.bind(lambda: state.engine, settings.model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.create_task(_load(state, engine))
        try:
            yield
        finally:
            loader.cancel()
            if state.engine is not None:
                await state.engine.stop()

    app = FastAPI(title="Hetero-Paged-Infer", lifespan=lifespan)
    app.state.server = state
    app.include_router(openai_router)
    app.include_router(lora_router)
    app.include_router(ollama_router)
    app.include_router(anthropic_router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(server_info.router)
    app.include_router(prefix_cache.router)
    app.include_router(ui.router)
    middleware.install(app, settings)
    install_error_handlers(app)
    return app


async def _load(state: ServerState, engine: LLMEngine | None) -> None:
    try:
        max_pending = state.settings.max_waiting_requests
        if engine is None:
            state.engine = await AsyncEngine.load(state.settings.engine, max_pending)
        else:
            state.engine = AsyncEngine(engine, max_pending)
        state.engine.start()
        for name, path in state.settings.lora_modules:  # --lora-modules: a bad one stops us
            await state.engine.call(lambda llm, n=name, p=path: llm.adapters.load(n, p))
        # One real request through the whole path before we call ourselves ready.
        params = SamplingParams(max_tokens=1, temperature=0.0)
        warmup = state.engine.input_processor.process("warmup", [0], params)
        async for _ in state.engine.generate(warmup):
            pass
        _freeze_startup_heap()
        state.ready = True
        logger.info("ready to serve %s", ", ".join(state.settings.model_names))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        state.load_error = exc
        log_start_failure(exc)
        if state.stop_process is not None:
            state.stop_process()


def start_failure(exc: BaseException) -> str:
    """Why the engine could not start, in one line. The engine's errors about what it
    was given (ValueError: a model not found, an architecture not served, settings
    that cannot work) say it themselves; anything else is named by its type too."""
    text = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())  # a library's message may run over several lines


def log_start_failure(exc: BaseException) -> None:
    """The failure's line, with the traceback of anything but a ValueError (a bug, or
    a broken file)."""
    traceback = None if isinstance(exc, ValueError) else exc
    logger.error("the engine failed to start: %s", start_failure(exc), exc_info=traceback)


def _freeze_startup_heap() -> None:
    """Moves every object alive now (the model, the libraries' modules: millions of
    them) out of the garbage collector's sight: they live as long as the server. A full
    collection walked them all, holding Python's lock for 200-400 ms on 2 cores, which
    stalled the event loop (/healthz, every stream) several times a minute under load.
    The requests' own objects are still collected as before."""
    gc.collect()
    gc.freeze()
