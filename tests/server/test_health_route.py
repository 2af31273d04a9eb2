"""GET /health, vLLM's health check, which routers and load balancers probe: 200 with
an empty body only while the server can take requests, 503 while it loads, drains or
after its engine died (vLLM opens its port only once loaded, so its 200 means ready)."""

from __future__ import annotations

import pytest

from tests.server.conftest import LiveServer


def test_ready_server_answers_200_with_no_body(server: LiveServer) -> None:
    with server.client() as http:
        response = http.get("/health")
    assert response.status_code == 200
    assert response.content == b""


@pytest.mark.parametrize(
    "field, value, status",
    [("ready", False, "loading"), ("draining", True, "draining")],
)
def test_a_server_that_cannot_take_requests_answers_503(
    server: LiveServer, field: str, value: bool, status: str
) -> None:
    state = server.state
    saved = getattr(state, field)
    setattr(state, field, value)
    try:
        with server.client() as http:
            response = http.get("/health")
            # The same answer as the readiness probe's, so the two never disagree.
            readiness = http.get("/readyz")
    finally:
        setattr(state, field, saved)
    assert response.status_code == readiness.status_code == 503
    assert response.json() == {"status": status}
    with server.client() as http:
        assert http.get("/health").status_code == 200
