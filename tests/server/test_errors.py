"""The engine's typed errors map to OpenAI's error shape in one place."""

from __future__ import annotations

import pytest
from hetero_infer.engine.settings.exceptions import (
    ConfigError,
    ContextLengthError,
    ExecutionError,
    ModelNotFoundError,
    OutOfMemoryError,
    SchedulerError,
    ValidationError,
)
from hetero_infer.server.errors import APIError


@pytest.mark.parametrize(
    ("error", "status", "kind", "param"),
    [
        (
            ValidationError("top_p must be in (0, 1], got 2", param="top_p"),
            400,
            "invalid_request_error",
            "top_p",
        ),
        (ValidationError("bad", param="messages"), 400, "invalid_request_error", "messages"),
        (OutOfMemoryError("prompt needs 900 blocks"), 400, "invalid_request_error", None),
        (ConfigError("block_size must be ..."), 400, "invalid_request_error", None),
        (ValueError("n must be ..."), 400, "invalid_request_error", None),
        (ModelNotFoundError("model 'x': no such file"), 404, "not_found_error", "model"),
        (SchedulerError("too many requests are waiting"), 503, "service_unavailable", None),
        (ExecutionError("the engine loop has stopped"), 503, "service_unavailable", None),
        (RuntimeError("a bug"), 500, "internal_server_error", None),
    ],
)
def test_from_exception(error, status, kind, param):
    api = APIError.from_exception(error)
    assert (api.status_code, api.type, api.param) == (status, kind, param)
    body = api.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    if status == 503:
        assert api.headers == {"Retry-After": "5"}
    if status != 500:
        assert body["message"] == str(error)


def test_context_length_has_openai_code():
    error = ContextLengthError("This model's maximum context length is 8 tokens.", "messages")
    body = APIError.from_exception(error).body()["error"]
    assert (body["code"], body["param"]) == ("context_length_exceeded", "messages")
