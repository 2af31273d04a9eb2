"""server/middleware.py's caps at their edges: the request head's count and bytes, and
the body a Content-Length announces, on a bare app with the middleware installed and
driven as ASGI (a socket cannot hold a head at its exact size: uvicorn's parser has
limits of its own; test_abuse.py sends the far-off cases over one)."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from hetero_infer.server import middleware
from hetero_infer.server.middleware import MAX_HEADER_BYTES, MAX_HEADERS
from hetero_infer.server.settings import ServerSettings

MAX_BODY = 100
HOST = (b"host", b"127.0.0.1")  # 13 bytes of the head


@pytest.fixture(scope="module")
def app() -> FastAPI:
    app = FastAPI()

    @app.post("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    middleware.install(app, ServerSettings(max_body_bytes=MAX_BODY))
    return app


def status_of(app: FastAPI, headers: list[tuple[bytes, bytes]]) -> int:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/healthz",
        "raw_path": b"/healthz",
        "query_string": b"",
        "headers": [HOST, *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

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
