"""Errors in OpenAI's shape, {"error": {message, type, param, code}}, for every route.

APIError is what a route raises; from_exception is the one mapping of the engine's
typed errors (engine/settings/exceptions.py); install_error_handlers answers both, and
FastAPI's own errors, in that shape.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from hetero_infer.engine.settings.exceptions import (
    ContextLengthError,
    EngineError,
    ExecutionError,
    ModelNotFoundError,
    SchedulerError,
    ValidationError,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status_code: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code or type
        self.headers = headers

    @classmethod
    def from_exception(cls, exc: Exception) -> APIError:
        """The one mapping of the engine's errors (engine/settings/exceptions.py) to responses:
        bad input 400 naming the field, an unknown model 404, a full queue or a failed
        engine 503 with Retry-After."""
        message = str(exc)
        if isinstance(exc, ModelNotFoundError):
            return cls(404, message, "not_found_error", param="model", code="model_not_found")
        if isinstance(exc, SchedulerError | ExecutionError):
            return cls(503, message, "service_unavailable", headers={"Retry-After": "5"})
        if isinstance(exc, ContextLengthError):
            return cls(400, message, param=exc.param, code="context_length_exceeded")
        if isinstance(exc, ValueError):  # ValidationError, OutOfMemoryError, ConfigError
            param = exc.param if isinstance(exc, ValidationError) else None
            return cls(400, message, param=param)
        return cls(500, "internal server error", "internal_server_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def service_unavailable(message: str) -> APIError:
    return APIError(503, message, "service_unavailable", headers={"Retry-After": "5"})


class _ErrorResponse(JSONResponse):
    """JSON with non-ASCII escaped: an error may echo input (a model name, a field's
    key) holding a lone surrogate, which JSONResponse's UTF-8 encoding cannot take."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def error_response(error: APIError) -> JSONResponse:
    return _ErrorResponse(error.body(), status_code=error.status_code, headers=error.headers)


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return error_response(exc)


async def _engine_error(request: Request, exc: EngineError) -> JSONResponse:
    return error_response(APIError.from_exception(exc))


def validation_api_error(exc: RequestValidationError) -> APIError:
    """FastAPI's 422 as the 400 OpenAI (and vLLM) send, naming the field (the Ollama
    routes shape the same error their own way)."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    # (pydantic's prefix of a validator's own message says nothing to a client)
    message = first.get("msg", "invalid request").removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        message, param = "the request body is not valid JSON", None
    return APIError(400, f"{param}: {message}" if param else message, param=param)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(validation_api_error(exc))


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = {404: "not_found_error", 413: "request_too_large"}.get(
        exc.status_code, "invalid_request_error"
    )
    error = APIError(exc.status_code, str(exc.detail), kind, headers=exc.headers)
    return error_response(error)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error")
    return error_response(APIError(500, "internal server error", "internal_server_error"))


def api_error_of(exc: Exception) -> APIError:
    """Any exception a route raised as the APIError the app's handlers answer with."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineError):
        return APIError.from_exception(exc)
    if isinstance(exc, RequestValidationError):
        return validation_api_error(exc)
    if isinstance(exc, StarletteHTTPException):
        return APIError(exc.status_code, str(exc.detail), headers=exc.headers)
    logger.exception("unhandled error")
    return APIError(500, "internal server error", "internal_server_error")


def route_class_answering_in(
    render: Callable[[APIError], Response],
    validation_error: Callable[[RequestValidationError], APIError] = validation_api_error,
) -> type[APIRoute]:
    """An APIRoute class whose routes answer every error in their API family's own shape
    (``render``), before the app's handlers (OpenAI's shape) see it: for the Anthropic
    and Ollama routes. ``validation_error``: how the family names a body's bad field."""

    class FamilyRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handle = super().get_route_handler()

            async def handle_in_family_shape(request: Request) -> Response:
                try:
                    return await handle(request)
                except RequestValidationError as exc:
                    return render(validation_error(exc))
                except Exception as exc:
                    return render(api_error_of(exc))

            return handle_in_family_shape

    return FamilyRoute


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(EngineError, _engine_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
