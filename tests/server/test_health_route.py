"""GET /health, vLLM's health check, which routers and load balancers probe: 200 with
an empty body only while the server can take requests, 503 while it loads, drains or
after its engine died (vLLM opens its port only once loaded, so its 200 means ready).
/ping, SageMaker's name for it (GET or POST), answers the same."""

from __future__ import annotations

import pytest

from tests.server.conftest import LiveServer

PROBES = [("GET", "/health"), ("GET", "/ping"), ("POST", "/ping")]


def test_ready_server_answers_200_with_no_body(server: LiveServer) -> None:
    with server.client() as http:
        responses = [http.request(method, path) for method, path in PROBES]
    assert [r.status_code for r in responses] == [200] * len(PROBES)
    assert [r.content for r in responses] == [b""] * len(PROBES)


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
            responses = [http.request(method, path) for method, path in PROBES]
            # The same answer as the readiness probe's, so the two never disagree.
            readiness = http.get("/readyz")
    finally:
        setattr(state, field, saved)
    assert readiness.status_code == 503
    for response in responses:
        assert response.status_code == 503
        assert response.json() == {"status": status}
    with server.client() as http:
        assert http.get("/health").status_code == 200
