"""Errors on the Anthropic routes in Anthropic's shape:
``{"type": "error", "error": {"type": ..., "message": ...}}``, with the status the type
goes with. The OpenAI routes keep OpenAI's shape: AnthropicRoute answers its own
routes' errors before the app's handlers (server/errors.py) see them, and the
middleware's refusals (a bad key, too large a body) ask ``is_anthropic_path``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from hetero_infer.server.errors import APIError, route_class_answering_in, validation_api_error

PATH = "/v1/messages"
# Anthropic's error types by status. A full queue, a model still loading or a server
# draining stays a 503 with Retry-After (what load balancers act on) where Anthropic
# sends 529; the SDK retries both.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


def error_type(status_code: int) -> str:
    if status_code in ERROR_TYPES:
        return ERROR_TYPES[status_code]
    return "invalid_request_error" if status_code < 500 else "api_error"


def error_body(error: APIError) -> dict[str, Any]:
    """Anthropic's shape has no ``param``: the message names the field instead."""
    message = error.message
    if error.param and not message.startswith(error.param):
        message = f"{error.param}: {message}"
    return {
        "type": "error",
        "error": {"type": error_type(error.status_code), "message": message},
    }


def error_response(error: APIError) -> Response:
    # ASCII JSON: a message may echo input holding a lone surrogate.
    return Response(
        json.dumps(error_body(error)),
        status_code=error.status_code,
        headers=error.headers,
        media_type="application/json",
    )


def request_error(exc: RequestValidationError) -> APIError:
    """A body that does not validate: a 400 naming the field, in Anthropic's words."""
    error = validation_api_error(exc)
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "extra_forbidden":
        error.message = f"{error.param}: unknown field (not supported by this server)"
    elif first.get("type") == "union_tag_invalid":  # a content block's or source's type
        context = first.get("ctx", {})
        what = "image sources" if (error.param or "").endswith(".source") else "blocks"
        error.message = (
            f"{error.param}: {what} of type {context.get('tag')!r} are not supported "
            f"(documents, files and server tools are not); this server takes "
            f"{context.get('expected_tags')}"
        )
    return error


# The /v1/messages routes: every error in Anthropic's shape, whatever raised it.
AnthropicRoute = route_class_answering_in(error_response, request_error)
