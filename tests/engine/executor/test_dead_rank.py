"""A tensor-parallel rank that dies: the server says so (/healthz and /readyz 503) and
fails its requests in OpenAI's error shape, those in flight and those that come after,
whether the rank dies mid-step or while the server is idle. Nothing waits for ever:
every wait here has a deadline."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, LiveServer, make_engine, start_server, wait_until
from tests.tiny_models import save_tiny_model

BODY = {"model": MODEL_NAME, "prompt": "Hello world", "max_tokens": 400, "ignore_eos": True}


@pytest.fixture
def tp_server(tmp_path: Path) -> Iterator[LiveServer]:
    folder = save_tiny_model("mistral", tmp_path / "mistral")  # 6 heads, 2 KV heads
    live = start_server(folder, make_engine(folder, tensor_parallel_size=2))
    yield live
    live.stop()
    # Stopping the server stopped the other rank too, dead or not.
    assert live.engine.workers is None


def kill_worker(live: LiveServer) -> None:
    assert live.engine.workers is not None
    process = live.engine.workers.processes[0]
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def check_refused(live: LiveServer) -> None:
    with live.client() as http:
        assert http.get("/healthz").status_code == 503
        assert http.get("/readyz").status_code == 503
        for path, body in (
            ("/v1/completions", {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2}),
            ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "stream": True}),
        ):
            refused = http.post(path, json=body)
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "service_unavailable"


def test_rank_dies_mid_step(tp_server: LiveServer):
    async def main() -> tuple[list[str], httpx.Response]:
        async with tp_server.async_client(timeout=60) as http:
            got_tokens = asyncio.Event()

            async def streaming() -> list[str]:
                lines = []
                body = {**BODY, "stream": True}
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if line:
                            lines.append(line)
                        if len(lines) == 3:
                            got_tokens.set()
                return lines

            stream = asyncio.create_task(streaming())
            plain = asyncio.create_task(http.post("/v1/completions", json=BODY))
            await asyncio.wait_for(got_tokens.wait(), 60)
            assert not plain.done()
            kill_worker(tp_server)
            return await asyncio.wait_for(stream, 60), await asyncio.wait_for(plain, 60)

    lines, plain = asyncio.run(main())
    assert tp_server.state.is_dead
    assert plain.status_code == 503, plain.text
    assert plain.json()["error"]["code"] == "service_unavailable"
    # The stream: tokens, then an error event, then [DONE].
    assert lines[-1] == "data: [DONE]"
    assert lines[-3] == "event: error"
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert error["code"] == "service_unavailable" and error["message"]
    check_refused(tp_server)
    wait_until(lambda: tp_server.state.engine.num_pending == 0, 30, "the requests to be released")


def test_rank_dies_while_idle(tp_server: LiveServer):
    kill_worker(tp_server)
    with tp_server.client() as http:
        wait_until(lambda: http.get("/healthz").status_code == 503, 30, "/healthz to turn 503")
    message = str(tp_server.state.engine.dead_error)
    assert "tensor-parallel rank 1" in message and "exited with code -9" in message
    check_refused(tp_server)
