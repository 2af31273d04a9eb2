"""Request middleware: request ids, header and body-size caps, API key, CORS.

Plain ASGI-level checks run before any route parses a body, so a 10 MB body or a
bad key costs nothing beyond reading the headers.
"""

from __future__ import annotations

import hmac
import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from hetero_infer.server.anthropic.errors import error_body as anthropic_error_body
from hetero_infer.server.anthropic.errors import is_anthropic_path
from hetero_infer.server.errors import APIError
from hetero_infer.server.settings import ServerSettings
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

# Probes and scrapes stay open when an API key is set, as in vLLM (whose key guards /v1
# alone); so do what a router reads when it registers a replica (/health, /server_info),
# /version, and the chat page (server/routes/ui.py), whose own API calls send the key
# the user types.
OPEN_PATHS = (
    "/healthz",
    "/readyz",
    "/ready",
    "/health",
    "/ping",
    "/server_info",
    "/version",
    "/metrics",
    "/",
    "/static/chat.css",
    "/static/chat.js",
)
# Request heads beyond what any client sends get a 431. uvicorn's h11 parser limits
# only a head that arrives in pieces (16 KiB); one read (up to 256 KiB) passes whole.
MAX_HEADERS = 256
MAX_HEADER_BYTES = 64 * 1024


def install(app: FastAPI, settings: ServerSettings) -> None:
    expected_auth = f"Bearer {settings.api_key}".encode() if settings.api_key else None
    app.add_middleware(_BodyLimit, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(_Guard, settings=settings, expected_auth=expected_auth)
    if settings.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.allowed_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            # X-Api-Key and the anthropic-* headers: what Anthropic's clients send.
            allow_headers=[
                "Authorization",
                "Content-Type",
                "X-Request-Id",
                "X-Api-Key",
                "Anthropic-Version",
                "Anthropic-Beta",
            ],
        )


class _Guard:
    """The header caps, the body size a Content-Length announces and the API key,
    checked before the route runs; every answer gets an X-Request-Id and a log line.

    Plain ASGI, so a stream's chunks go straight to the client: starlette's
    BaseHTTPMiddleware (``@app.middleware("http")``) relays each chunk through a task
    and a memory stream, which cost about a millisecond of a streamed token's CPU time
    on a 2-core machine.
    """

    def __init__(self, app: ASGIApp, settings: ServerSettings, expected_auth: bytes | None) -> None:
        self.app = app
        self.settings = settings
        self.expected_auth = expected_auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["X-Request-Id"] = request_id
                logger.info(
                    "%s %s -> %d (request id %s)",
                    request.method,
                    request.url.path,
                    message["status"],
                    request_id,
                )
            await send(message)

        error = _check(request, self.settings, self.expected_auth)
        if error is not None:
            path = request.url.path
            body = anthropic_error_body(error) if is_anthropic_path(path) else error.body()
            response = JSONResponse(body, status_code=error.status_code)
            await response(scope, receive, send_with_id)
        else:
            await self.app(scope, receive, send_with_id)


def _check(request: Request, settings: ServerSettings, expected_auth: bytes | None):
    headers = request.scope["headers"]
    if len(headers) > MAX_HEADERS or sum(len(k) + len(v) for k, v in headers) > MAX_HEADER_BYTES:
        return APIError(
            431,
            f"request headers: at most {MAX_HEADERS}, of at most {MAX_HEADER_BYTES} bytes in all",
            code="request_header_fields_too_large",
        )
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > settings.max_body_bytes):
        return APIError(
            413,
            f"request body larger than {settings.max_body_bytes} bytes",
            "request_too_large",
        )
    if expected_auth is None or request.method == "OPTIONS":
        return None
    if request.url.path in OPEN_PATHS:
        return None
    given = request.headers.get("authorization", "").encode()
    # Anthropic's clients send the key as x-api-key: taken on every route.
    api_key = request.headers.get("x-api-key", "").encode()
    if api_key and hmac.compare_digest(api_key, (settings.api_key or "").encode()):
        return None
    if not hmac.compare_digest(given, expected_auth):
        return APIError(
            401, "invalid or missing API key", "authentication_error", code="invalid_api_key"
        )
    return None


class _BodyLimit:
    """Caps bodies sent without a Content-Length (chunked), which guard() cannot see.

    Raised while the route reads the body, the HTTPException becomes a 413 in
    OpenAI's shape through the app's handler.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received = 0

        async def receive_limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise HTTPException(
                        413, f"request body larger than {self.max_body_bytes} bytes"
                    )
            return message

        await self.app(scope, receive_limited, send)
