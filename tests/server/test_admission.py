"""Admission control a load balancer can act on: a request past --max-waiting-requests,
or one that waited longer than --max-queue-time before it could start, gets 503 with
Retry-After, streamed or not (a stream's status line waits for its first output), on
every API family in its own error shape, and /metrics counts the rejections by reason."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import LiveServer, make_engine, start_server, wait_until
from tests.server.gauges import gauges
from tests.server.route_shapes import error_message
from tests.server.test_abuse_routes import STREAMED
from tests.server.test_bad_input import COMPLETIONS, completion
from tests.server.test_cli import settings_for

MAX_QUEUE_TIME = 0.5
CONTEXT = 1024  # the tiny model's longest: the request that holds the slot runs long
SHORT = completion(max_tokens=4)
# Short requests: completions whole and streamed, and each other family's stream.
SHORT_REQUESTS = [
    (COMPLETIONS, SHORT),
    (COMPLETIONS, {**SHORT, "stream": True}),
    *((path, streamed(2)) for path, streamed in STREAMED.items()),
]
# The one that holds the slot and the short ones behind it.
MAX_WAITING_REQUESTS = 1 + len(SHORT_REQUESTS)


@pytest.fixture(scope="module")
def busy_server(model_dir: Path) -> Iterator[LiveServer]:
    """One running slot (max_num_seqs 1), so a second request waits in the queue."""
    engine = make_engine(
        model_dir, max_num_seqs=1, max_queue_time=MAX_QUEUE_TIME, max_model_len=CONTEXT
    )
    live = start_server(model_dir, engine=engine, max_waiting_requests=MAX_WAITING_REQUESTS)
    yield live
    live.stop()


def rejections(http: httpx.Client) -> dict[str, float]:
    """vllm:admission_rejections_total by reason."""
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(http.get("/metrics").text)
        if family.name == "vllm:admission_rejections"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def check_unavailable(response: httpx.Response, words: str) -> None:
    assert response.status_code == 503, response.text
    message = error_message(response.request.url.path, response.json())
    assert words in message, message
    assert int(response.headers["retry-after"]) >= 1


async def post(http: httpx.AsyncClient, path: str, body: dict) -> httpx.Response:
    """A request; the response read whole."""
    async with http.stream("POST", path, json=body) as response:
        await response.aread()
    return response


async def hold_the_slot(http: httpx.AsyncClient, started: asyncio.Event) -> None:
    """A long stream that keeps the one running slot until it is cancelled."""
    body = completion(max_tokens=CONTEXT - 8, ignore_eos=True, stream=True)
    async with http.stream("POST", COMPLETIONS, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                started.set()
    raise AssertionError("the long request ended before the test did")


def test_full_queue_and_late_start_get_503(busy_server: LiveServer):
    server = busy_server
    with server.client() as sync_http:
        before = rejections(sync_http)

    async def main() -> tuple[list[httpx.Response], list[httpx.Response], float]:
        limits = httpx.Limits(max_connections=10)
        async with server.async_client(timeout=60, limits=limits) as http:
            started = asyncio.Event()
            holder = asyncio.create_task(hold_the_slot(http, started))
            await asyncio.wait_for(started.wait(), 30)
            # The short ones wait behind it: the limit of requests in hand.
            loop = asyncio.get_running_loop()
            queued_at = loop.time()
            waiting = [asyncio.create_task(post(http, *request)) for request in SHORT_REQUESTS]
            while server.state.engine.num_pending < MAX_WAITING_REQUESTS:
                await asyncio.sleep(0.005)
            # One more is refused at once, streamed or not.
            full = [await post(http, *request) for request in SHORT_REQUESTS]
            # Those waiting are refused once they have waited max_queue_time.
            late = await asyncio.gather(*waiting)
            waited = loop.time() - queued_at
            assert not holder.done(), "the slot was free before max_queue_time"
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)
            return full, late, waited

    full, late, waited = asyncio.run(main())
    for response in full:
        check_unavailable(response, "max_waiting_requests")
    for response in late:
        check_unavailable(response, "max_queue_time")
    assert waited >= MAX_QUEUE_TIME
    with server.client() as http:
        after = rejections(http)
        assert after["queue_full"] - before.get("queue_full", 0) == len(SHORT_REQUESTS)
        assert after["queue_time"] - before.get("queue_time", 0) == len(SHORT_REQUESTS)
        wait_until(lambda: gauges(http)["kv_cache_usage_perc"] == 0, 10, "the blocks to free")
        assert server.state.engine.num_pending == 0
        served = http.post(COMPLETIONS, json=SHORT)  # a free slot: served at once
        assert served.status_code == 200, served.text


def test_the_flags():
    argv = ["--max-queue-time", "2.5", "--max-waiting-requests", "7"]
    settings = settings_for(argv, {})
    assert settings.engine.max_queue_time == 2.5 and settings.max_waiting_requests == 7
    assert settings_for([], {"HETERO_MAX_QUEUE_TIME": "3"}).engine.max_queue_time == 3.0
    assert settings_for([], {}).engine.max_queue_time is None
