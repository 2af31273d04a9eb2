"""server/middleware.py's caps at their edges: the request head's count and bytes, the
body a Content-Length announces and a body sent without one (chunked); and the API key
in either header. On a bare app
with the middleware installed and driven as ASGI (a socket cannot hold a head at its
exact size: uvicorn's parser has limits of its own; test_abuse.py sends the far-off
cases over one)."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI, Request
from hetero_infer.server import middleware
from hetero_infer.server.middleware import MAX_HEADER_BYTES, MAX_HEADERS
from hetero_infer.server.settings import ServerSettings

MAX_BODY = 100
HOST = (b"host", b"127.0.0.1")  # 13 bytes of the head
KEY = "k-123"


def bare_app(**settings: object) -> FastAPI:
    app = FastAPI()

    @app.post("/healthz")  # open, as every probe is
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/models")
    async def keyed() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def reads_the_body(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    middleware.install(app, ServerSettings(max_body_bytes=MAX_BODY, **settings))
    return app


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return bare_app()


def status_of(
    app: FastAPI,
    headers: list[tuple[bytes, bytes]],
    path: str = "/healthz",
    chunks: tuple[bytes, ...] = (b"",),
) -> int:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [HOST, *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent: list[dict] = []
    pending = list(chunks)

    async def receive() -> dict:
        body = pending.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"]


@pytest.mark.parametrize(("count", "status"), [(MAX_HEADERS, 200), (MAX_HEADERS + 1, 431)])
def test_the_count_of_headers(app: FastAPI, count: int, status: int):
    headers = [(f"x-h{i}".encode(), b"v") for i in range(count - 1)]  # and the host
    assert status_of(app, headers) == status


@pytest.mark.parametrize(("size", "status"), [(MAX_HEADER_BYTES, 200), (MAX_HEADER_BYTES + 1, 431)])
def test_the_bytes_of_the_head(app: FastAPI, size: int, status: int):
    name = b"x-big"
    value = b"a" * (size - sum(map(len, HOST)) - len(name))
    assert status_of(app, [(name, value)]) == status


@pytest.mark.parametrize(
    ("length", "status"),
    [(str(MAX_BODY), 200), (str(MAX_BODY + 1), 413), ("12x", 413), ("-1", 413)],
)
def test_the_announced_length_of_the_body(app: FastAPI, length: str, status: int):
    assert status_of(app, [(b"content-length", length.encode())]) == status


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"authorization": f"Bearer {KEY}"}, 200),
        ({"authorization": f"Bearer {KEY[:-1]}"}, 401),
        ({"authorization": KEY}, 401),
        ({"x-api-key": KEY}, 200),  # Anthropic's clients' header
        ({"x-api-key": "wrong"}, 401),
        ({"x-api-key": "wrong", "authorization": f"Bearer {KEY}"}, 200),
    ],
)
def test_the_api_key(headers: dict[str, str], status: int):
    keyed = bare_app(api_key=KEY)
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    assert status_of(keyed, raw, "/v1/models") == status
    assert status_of(keyed, raw, "/healthz") == 200  # probes stay open


@pytest.mark.parametrize(("size", "status"), [(MAX_BODY, 200), (MAX_BODY + 1, 413)])
def test_the_bytes_of_a_body_without_a_length(app: FastAPI, size: int, status: int):
    chunks = (b"a" * (size // 2), b"a" * (size - size // 2))
    assert status_of(app, [], "/v1/completions", chunks) == status
