"""A dead engine loop: probes turn 503, requests in flight fail in OpenAI's shape (an SSE
error event then [DONE] for streams), and new requests get 503. The other API families'
streams in flight end with their own in-band error, and their new streamed requests get
a 503 in their own error shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, LiveServer, start_server, wait_until
from tests.server.route_shapes import (
    RouteStream,
    error_message,
    parse_anthropic_stream,
    parse_ndjson_stream,
    parse_responses_stream,
    route_family,
)
from tests.server.test_abuse_routes import STREAMED

BODY = {"model": MODEL_NAME, "prompt": "Hello world", "max_tokens": 400, "ignore_eos": True}
CHAT_BODY = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "Hello"}],
    "max_tokens": 400,
    "ignore_eos": True,
}

LONG = 400  # the other families' streams: in flight when the engine dies
STREAM_PARSERS: dict[str, Callable[[str], RouteStream]] = {
    "responses": parse_responses_stream,
    "anthropic": parse_anthropic_stream,
    "ollama": parse_ndjson_stream,
}


def broken_forward(*args, **kwargs):  # the model pass
    raise RuntimeError("injected device failure")


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


def test_each_familys_streams_end_in_band_and_new_ones_are_refused_in_its_shape(
    doomed: LiveServer, monkeypatch: pytest.MonkeyPatch
):
    async def read(http: httpx.AsyncClient, path: str, started: asyncio.Event) -> str:
        async with http.stream("POST", path, json=STREAMED[path](LONG)) as response:
            assert response.status_code == 200, await response.aread()
            text = ""
            async for piece in response.aiter_text():
                text += piece
                started.set()
        return text

    # These bodies sample, and the tiny model draws its end of text now and then: none
    # may end its stream by itself before the engine dies.
    monkeypatch.setattr(doomed.engine.tokenizer, "_eos_token_ids", frozenset())

    async def main() -> dict[str, str]:
        limits = httpx.Limits(max_connections=10)
        async with doomed.async_client(timeout=120, limits=limits) as http:
            started = {path: asyncio.Event() for path in STREAMED}
            reads = {path: asyncio.create_task(read(http, path, started[path])) for path in started}
            for event in started.values():
                await asyncio.wait_for(event.wait(), 60)
            assert doomed.state.engine.num_pending == len(STREAMED)
            monkeypatch.setattr(doomed.engine.runner.model, "forward", broken_forward)
            return {path: await asyncio.wait_for(task, 60) for path, task in reads.items()}

    for path, text in asyncio.run(main()).items():
        [error] = STREAM_PARSERS[route_family(path)](text).errors  # the stream's last event or line
        message = error if isinstance(error, str) else error["message"]
        assert "injected device failure" in message, (path, error)

    assert doomed.state.is_dead
    with doomed.client() as http:
        for path, streamed in STREAMED.items():
            refused = http.post(
                path, json=streamed(LONG)
            )  # before any output: a status line of its own
            assert refused.status_code == 503, (path, refused.text)
            assert error_message(path, refused.json()), path
    wait_until(lambda: doomed.state.engine.num_pending == 0, 30, "the requests to be released")
