"""A dead engine loop: probes turn 503, requests in flight fail in OpenAI's shape (an SSE
error event then [DONE] for streams), and new requests get 503."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, LiveServer, start_server, wait_until

BODY = {"model": MODEL_NAME, "prompt": "Hello world", "max_tokens": 400, "ignore_eos": True}
CHAT_BODY = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "Hello"}],
    "max_tokens": 400,
    "ignore_eos": True,
}


@pytest.fixture
def doomed(model_dir: Path) -> Iterator[LiveServer]:
    """A server of its own: this test kills its engine."""
    live = start_server(model_dir)
    yield live
    live.stop()


def check_error(error: dict, codes: tuple[str, ...]) -> None:
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] in codes, error
    assert isinstance(error["message"], str) and error["message"]


def test_dead_engine_loop(doomed: LiveServer, monkeypatch: pytest.MonkeyPatch):
    runner = doomed.engine.runner

    def broken_forward(*args, **kwargs):  # the model pass
        raise RuntimeError("injected device failure")

    async def streaming(http: httpx.AsyncClient, got_tokens: asyncio.Event) -> list[tuple]:
        events: list[tuple] = []  # (event name, data)
        body = {**CHAT_BODY, "stream": True}
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            name = "message"
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    events.append((name, line[6:]))
                    name = "message"
                    if len(events) == 3:
                        got_tokens.set()
        return events

    async def main() -> tuple[list[tuple], httpx.Response]:
        async with httpx.AsyncClient(base_url=doomed.url, timeout=120) as http:
            got_tokens = asyncio.Event()
            stream = asyncio.create_task(streaming(http, got_tokens))
            plain = asyncio.create_task(http.post("/v1/completions", json=BODY))
            await asyncio.wait_for(got_tokens.wait(), 60)

            async def both_in_flight() -> None:
                while doomed.state.engine.num_pending < 2:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(both_in_flight(), 60)
            assert not plain.done()
            monkeypatch.setattr(runner.model, "forward", broken_forward)
            return await asyncio.wait_for(stream, 60), await asyncio.wait_for(plain, 60)

    events, plain = asyncio.run(main())
    assert doomed.state.is_dead

    # The non-streaming request in flight: a 5xx in OpenAI's shape.
    assert plain.status_code in (500, 503), plain.text
    check_error(plain.json()["error"], ("service_unavailable", "internal_server_error"))

    # The stream: some chunks, then an error event, then [DONE].
    names = [name for name, _ in events]
    assert events[-1] == ("message", "[DONE]")
    assert names[-2] == "error" and names.count("error") == 1
    check_error(json.loads(events[-2][1])["error"], ("service_unavailable",))
    assert "injected device failure" in json.loads(events[-2][1])["error"]["message"]
    assert all(json.loads(data)["choices"] for _, data in events[:-2])

    with doomed.client() as http:
        assert http.get("/healthz").status_code == 503
        assert http.get("/readyz").status_code == 503
        assert http.get("/health").json() == {"status": "dead"}
        for path, body in (
            ("/v1/completions", {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
            ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "stream": True}),
        ):
            refused = http.post(path, json=body)
            assert refused.status_code == 503, refused.text
            check_error(refused.json()["error"], ("service_unavailable",))
        assert http.get("/metrics").status_code == 200
    wait_until(lambda: doomed.state.engine.num_pending == 0, 30, "the requests to be released")
