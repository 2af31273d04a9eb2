"""SIGTERM drains: streams in flight finish, new work gets 503, the process exits 0.

The server runs as `python -m server.cli serve` in a subprocess, so the signal goes
through uvicorn's real handlers.
"""

from __future__ import annotations

import asyncio
import json

import httpx

from tests.server.conftest import MODEL_NAME, ServerProcess

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
