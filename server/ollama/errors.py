"""Errors in Ollama's shape, ``{"error": "message"}``, for the /api/* routes.

The app's handlers answer in OpenAI's shape, so the Ollama router's routes (OllamaRoute)
turn every error raised while handling a request into Ollama's shape themselves: a
body that does not validate, an APIError, an engine error, a body over the size limit.
Middleware refusals (a missing API key, too many headers) still come in OpenAI's shape:
they answer before any route runs.
"""

from __future__ import annotations

import json

from fastapi.responses import Response
from hetero_infer.server.errors import APIError, route_class_answering_in


def error_body(error: APIError) -> dict[str, str]:
    return {"error": error.message}


def error_response(error: APIError) -> Response:
    # ASCII-escaped: a message may echo input holding a lone surrogate.
    content = json.dumps(error_body(error)).encode()
    return Response(
        content, error.status_code, headers=error.headers, media_type="application/json"
    )


# The /api/* routes: every error in Ollama's shape, whatever raised it.
OllamaRoute = route_class_answering_in(error_response)
