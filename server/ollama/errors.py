"""Errors in Ollama's shape, ``{"error": "message"}``, for the /api/* routes.

The app's handlers answer in OpenAI's shape, so the Ollama router's routes (OllamaRoute)
turn every error raised while handling a request into Ollama's shape themselves: a
body that does not validate, an APIError, an engine error, a body over the size limit.
Middleware refusals (a missing API key, too many headers) still come in OpenAI's shape:
they answer before any route runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from hetero_infer.engine.exceptions import EngineError
from hetero_infer.server.errors import APIError, validation_api_error
from starlette.exceptions import HTTPException as StarletteHTTPException


def error_body(error: APIError) -> dict[str, str]:
    return {"error": error.message}


def error_response(error: APIError) -> Response:
    # ASCII-escaped: a message may echo input holding a lone surrogate.
    content = json.dumps(error_body(error)).encode()
    return Response(
        content, error.status_code, headers=error.headers, media_type="application/json"
    )


class OllamaRoute(APIRoute):
    """A route whose errors come in Ollama's shape, whatever raised them."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def handle_in_ollama_shape(request: Request) -> Response:
            try:
                return await handle(request)
            except RequestValidationError as exc:
                return error_response(validation_api_error(exc))
            except APIError as exc:
                return error_response(exc)
            except EngineError as exc:
                return error_response(APIError.from_exception(exc))
            except StarletteHTTPException as exc:  # a body over --max-body-bytes
                return error_response(APIError(exc.status_code, str(exc.detail)))

        return handle_in_ollama_shape
