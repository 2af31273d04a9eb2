"""Request middleware: request ids, body-size cap, API key, CORS.

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

from server.protocol import APIError
from server.settings import ServerSettings

logger = logging.getLogger(__name__)

# Probes and scrapes stay open when an API key is set, as in vLLM.
OPEN_PATHS = ("/healthz", "/readyz", "/metrics")


def install(app: FastAPI, settings: ServerSettings) -> None:
    expected_auth = f"Bearer {settings.api_key}".encode() if settings.api_key else None

    @app.middleware("http")
    async def guard(request: Request, call_next):
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        error = _check(request, settings, expected_auth)
        if error is not None:
            response = JSONResponse(error.body(), status_code=error.status_code)
        else:
            response = await call_next(request)
        response.headers["X-Request-Id"] = request_id
        logger.info(
            "%s %s -> %d (request id %s)",
            request.method,
            request.url.path,
            response.status_code,
            request_id,
        )
        return response

    if settings.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.allowed_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
        )


def _check(request: Request, settings: ServerSettings, expected_auth: bytes | None):
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
    if not hmac.compare_digest(given, expected_auth):
        return APIError(
            401, "invalid or missing API key", "authentication_error", code="invalid_api_key"
        )
    return None
