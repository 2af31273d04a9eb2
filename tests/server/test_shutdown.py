"""SIGTERM drains: streams in flight finish, new work gets 503, the process exits 0.

The server runs as the installed `hetero-infer serve` in a subprocess, so the signal
goes through uvicorn's real handlers. Past the drain's deadline, requests still running
end with an error (streams: an error event and [DONE]); a second signal stops at once.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, ServerProcess, spawn_installed

NUM_STREAMS = 8
MAX_TOKENS = 400


async def stream_to_end(
    http: httpx.AsyncClient, index: int, started: asyncio.Event, finished: list[int]
) -> dict:
    body = {
        "model": MODEL_NAME,
        "prompt": f"Hello world {index}",
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks: list[dict] = []
    done = False
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
                started.set()
    finished.append(index)
    return {"done": done, "chunks": chunks}


def test_sigterm_drains_streams(server_process_factory):
    proc: ServerProcess = server_process_factory("--shutdown-timeout", "120")
    proc.wait_ready()

    async def main() -> tuple[list[dict], list[int], httpx.Response, httpx.Response]:
        limits = httpx.Limits(max_connections=NUM_STREAMS + 4)
        async with httpx.AsyncClient(base_url=proc.url, timeout=120, limits=limits) as http:
            events = [asyncio.Event() for _ in range(NUM_STREAMS)]
            finished: list[int] = []
            tasks = [
                asyncio.create_task(stream_to_end(http, i, ev, finished))
                for i, ev in enumerate(events)
            ]
            await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in events)), 120)
            proc.terminate()

            async def draining() -> httpx.Response:
                while True:
                    ready = await http.get("/readyz")
                    if ready.status_code == 503:
                        return ready
                    await asyncio.sleep(0.02)

            ready = await asyncio.wait_for(draining(), 60)
            refused = await http.post(
                "/v1/completions", json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2}
            )
            finished_at_refusal = list(finished)
            results = await asyncio.gather(*tasks)
            return results, finished_at_refusal, ready, refused

    results, finished_at_refusal, ready, refused = asyncio.run(main())
    assert len(finished_at_refusal) < NUM_STREAMS, "the streams ended before the drain was seen"
    assert ready.json()["status"] == "draining"
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "service_unavailable" and "shutting down" in error["message"]
    for result in results:
        assert result["done"], "a stream was cut before [DONE]"
        *text_chunks, usage_chunk = result["chunks"]
        assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert usage_chunk["choices"] == []
        assert usage_chunk["usage"]["completion_tokens"] == MAX_TOKENS
    assert proc.process.wait(timeout=60) == 0, proc.log()


# ---- the drain's end, and a second signal: on the tiny model given room for streams
# of 32,000 tokens, which outlast the waits below on any machine these tests run on (a
# step takes a millisecond at least: half a minute). It starts in half the time the
# embedded model takes.
LONG_MODEL_LEN = 32768
LONG_STREAM = {
    "prompt": "Once upon a time",
    "max_tokens": LONG_MODEL_LEN - 768,
    "ignore_eos": True,
    "stream": True,
}


@pytest.fixture(scope="module")
def long_model(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with positions up to LONG_MODEL_LEN (its weights are random: no
    position means more than another)."""
    folder = tmp_path_factory.mktemp("tiny-llama-long")
    for path in model_dir.iterdir():
        shutil.copy(path, folder / path.name)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = LONG_MODEL_LEN
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def spawn_long(model: Path, log_dir: Path, shutdown_timeout: int) -> ServerProcess:
    """The installed server on ``model``, with KV blocks for one stream of LONG_MODEL_LEN."""
    args = ["--model", str(model), "--max-model-len", str(LONG_MODEL_LEN)]
    args += ["--max-num-blocks", str(LONG_MODEL_LEN // 16), "--served-model-name", MODEL_NAME]
    return spawn_installed([*args, "--shutdown-timeout", str(shutdown_timeout)], log_dir)


async def read_stream(http: httpx.AsyncClient, started: asyncio.Event) -> list[str]:
    """A stream's SSE lines, until the server ends it."""
    lines: list[str] = []
    async with http.stream("POST", "/v1/completions", json=LONG_STREAM) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line:
                lines.append(line)
                started.set()
    return lines


def ended_with_shutdown_error(lines: list[str]) -> str:
    """The message of the error event a stream cut by the shutdown ends with."""
    assert lines[-3:-1][0] == "event: error" and lines[-1] == "data: [DONE]", lines[-3:]
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert error["code"] == "service_unavailable", error
    return error["message"]


def stream_then_signal(proc: ServerProcess, signals: list[signal.Signals]) -> list[str]:
    """A long stream, then ``signals`` (the second once the server drains), until the
    stream ends."""

    async def main() -> list[str]:
        async with httpx.AsyncClient(base_url=proc.url, timeout=120) as http:
            started = asyncio.Event()
            stream = asyncio.create_task(read_stream(http, started))
            await asyncio.wait_for(started.wait(), 120)
            first, *more = signals
            proc.process.send_signal(first)
            while (await http.get("/readyz")).json()["status"] != "draining":
                await asyncio.sleep(0.02)
            for sig in more:
                proc.process.send_signal(sig)
            return await asyncio.wait_for(stream, 60)

    return asyncio.run(main())


def test_the_drain_deadline_ends_streams_with_an_error(long_model: Path, tmp_path: Path):
    proc = spawn_long(long_model, tmp_path, shutdown_timeout=2)
    try:
        proc.wait_ready()
        lines = stream_then_signal(proc, [signal.SIGTERM])
        assert proc.process.wait(timeout=60) == 0, proc.log()
    finally:
        proc.kill()
    assert "shut down (2 s after a signal)" in ended_with_shutdown_error(lines)
    # uvicorn's own wait for connections did not come on top of the drain's.
    assert "Waiting for connections to close" not in proc.log()


def test_a_second_signal_stops_at_once(long_model: Path, tmp_path: Path):
    proc = spawn_long(long_model, tmp_path, shutdown_timeout=600)
    try:
        proc.wait_ready()
        lines = stream_then_signal(proc, [signal.SIGINT, signal.SIGINT])
        # Long before the drain's 600 s: the second Ctrl-C does not wait for it.
        assert proc.process.wait(timeout=60) == 128 + signal.SIGINT, proc.log()
    finally:
        proc.kill()
    assert "the server stopped" in ended_with_shutdown_error(lines)
    assert "Traceback" not in proc.log()
