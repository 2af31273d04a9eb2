"""API key, request ids and CORS."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import MODEL_NAME, LiveServer, start_server

API_KEY = "sekret-key"
ALLOWED_ORIGIN = "https://allowed.example"
OTHER_ORIGIN = "https://evil.example"
COMPLETION = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 3}


@pytest.fixture(scope="module")
def secured(model_dir: Path) -> Iterator[LiveServer]:
    """A server with an API key and one allowed CORS origin."""
    live = start_server(model_dir, api_key=API_KEY, allowed_origins=(ALLOWED_ORIGIN,))
    yield live
    live.stop()


def check_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "authentication_error"
    assert isinstance(error["code"], str) and error["code"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": API_KEY},
        {"Authorization": f"Basic {API_KEY}"},
        {"Authorization": f"Bearer {API_KEY}x"},
    ],
    ids=["none", "wrong", "no-bearer", "basic", "longer"],
)
def test_v1_needs_the_key(secured: LiveServer, headers: dict[str, str]):
    with secured.client() as http:
        check_401(http.get("/v1/models", headers=headers))
        check_401(http.get(f"/v1/models/{MODEL_NAME}", headers=headers))
        check_401(http.post("/v1/completions", json=COMPLETION, headers=headers))
        check_401(
            http.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}]},
                headers=headers,
            )
        )
    assert secured.state.engine.num_pending == 0


def test_v1_with_the_key(secured: LiveServer):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with secured.client(headers=auth) as http:
        assert http.get("/v1/models").status_code == 200
        out = http.post("/v1/completions", json=COMPLETION)
        assert out.status_code == 200 and out.json()["choices"]


def test_probes_and_metrics_stay_open(secured: LiveServer):
    with secured.client() as http:
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").status_code == 200
        assert http.get("/health").status_code == 200
        assert http.get("/ping").status_code == 200
        assert http.post("/ping").status_code == 200
        assert http.get("/server_info").json() == {"served_model_name": MODEL_NAME}
        # the package's own version, as vLLM's /version gives its own
        assert http.get("/version").json() == {"version": metadata.version("hetero-paged-infer")}
        metrics = http.get("/metrics")
        assert metrics.status_code == 200 and "vllm:num_requests_running" in metrics.text


def test_openai_client_and_the_key(secured: LiveServer):
    with openai.OpenAI(base_url=f"{secured.url}/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as info:
            client.models.list()
        assert info.value.status_code == 401
    with openai.OpenAI(base_url=f"{secured.url}/v1", api_key=API_KEY, max_retries=0) as client:
        assert [m.id for m in client.models.list().data] == [MODEL_NAME]
        out = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=3)
        assert out.choices[0].finish_reason in ("length", "stop")


def test_request_id_is_echoed(server: LiveServer, secured: LiveServer):
    with server.client() as http:
        given = http.get("/v1/models", headers={"X-Request-Id": "my-request-42"})
        assert given.headers["x-request-id"] == "my-request-42"
        made = http.post("/v1/completions", json=COMPLETION)
        assert made.status_code == 200 and made.headers["x-request-id"]
        other = http.get("/healthz")
        assert other.headers["x-request-id"] not in ("", made.headers["x-request-id"])
        bad = http.post("/v1/completions", json={"prompt": ""}, headers={"X-Request-Id": "b-1"})
        assert bad.status_code == 400 and bad.headers["x-request-id"] == "b-1"
        stream = http.post(
            "/v1/completions", json={**COMPLETION, "stream": True}, headers={"X-Request-Id": "s"}
        )
        assert stream.headers["x-request-id"] == "s" and "[DONE]" in stream.text
    with secured.client() as http:  # refused requests carry it too
        refused = http.get("/v1/models", headers={"X-Request-Id": "r-7"})
        assert refused.status_code == 401 and refused.headers["x-request-id"] == "r-7"


def test_cors_off_by_default(server: LiveServer):
    with server.client() as http:
        simple = http.get("/v1/models", headers={"Origin": ALLOWED_ORIGIN})
        assert simple.status_code == 200
        assert "access-control-allow-origin" not in simple.headers
        preflight = http.options(
            "/v1/chat/completions",
            headers={"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in preflight.headers


def test_cors_for_configured_origins(secured: LiveServer):
    with secured.client() as http:
        preflight = http.options(
            "/v1/chat/completions",
            headers={
                "Origin": ALLOWED_ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        simple = http.get(
            "/v1/models",
            headers={"Origin": ALLOWED_ORIGIN, "Authorization": f"Bearer {API_KEY}"},
        )
        assert simple.status_code == 200
        assert simple.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        other = http.get(
            "/v1/models", headers={"Origin": OTHER_ORIGIN, "Authorization": f"Bearer {API_KEY}"}
        )
        assert "access-control-allow-origin" not in other.headers
        other_preflight = http.options(
            "/v1/models",
            headers={"Origin": OTHER_ORIGIN, "Access-Control-Request-Method": "GET"},
        )
        assert "access-control-allow-origin" not in other_preflight.headers
