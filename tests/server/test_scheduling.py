"""Priority and time limits against live servers with the real engine on a tiny Llama:
`priority` needs --scheduling-policy priority (else a 400 naming it); a high-priority
request preempts a running low-priority one, which then ends exactly as it would have;
a request past its time limit ends with what it has ("length") or, with nothing yet, a
408 (whole) or a final "abort" chunk (stream); its blocks are freed and it is counted.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from hetero_infer.engine import SamplingParams

from tests.server.conftest import LiveServer, make_engine, start_server, wait_until
from tests.server.test_metrics import scrape, value

PROMPT = [5, 6, 7, 8]
# The tiny model writes a token in about a millisecond: 1000 of them take far longer
# than LIMIT, and the first one comes far sooner.
LONG_MAX_TOKENS = 1000
LIMIT = 0.3


@pytest.fixture(scope="module")
def limited_server(model_dir) -> Iterator[LiveServer]:
    """--request-timeout LIMIT, and room for LONG_MAX_TOKENS."""
    engine = make_engine(model_dir, max_model_len=1024, request_timeout=LIMIT)
    live = start_server(model_dir, engine)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def priority_server(model_dir) -> Iterator[LiveServer]:
    """--scheduling-policy priority with one sequence at a time, so that a request of a
    higher priority must preempt the running one. In fp32, where recomputing a
    preempted request's KV gives the same greedy tokens (as the exactness tests show)."""
    engine = make_engine(model_dir, scheduling_policy="priority", max_num_seqs=1, dtype="float32")
    live = start_server(model_dir, engine)
    yield live
    live.stop()


def sse_chunks(response: httpx.Response) -> list[dict]:
    """The JSON chunks of an SSE stream, which must end with [DONE]."""
    data = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    assert data and data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def wait_for_free_blocks(live: LiveServer) -> None:
    wait_until(lambda: live.engine.memory_stats()["used_blocks"] == 0, 30, "the KV blocks back")


def long_request(**fields) -> dict:
    return {"prompt": PROMPT, "max_tokens": LONG_MAX_TOKENS, "ignore_eos": True, **fields}


# ---- priority ----


# A small body of each route that takes vLLM's priority.
PRIORITY_ROUTES = {
    "/v1/completions": {"max_tokens": 2, "prompt": PROMPT},
    "/v1/chat/completions": {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/embeddings": {"input": PROMPT},
    "/v1/score": {"text_1": "a b", "text_2": "c"},
    "/v1/rerank": {"query": "a b", "documents": ["c"]},
}


@pytest.mark.parametrize("route", PRIORITY_ROUTES)
def test_a_priority_needs_the_priority_policy(server: LiveServer, route: str):
    body = PRIORITY_ROUTES[route]
    with server.client() as http:
        response = http.post(route, json={**body, "priority": 3})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "priority" and "--scheduling-policy priority" in error["message"]
        assert http.post(route, json={**body, "priority": 0}).status_code == 200


def test_a_higher_priority_request_preempts_a_running_one(priority_server: LiveServer, model_dir):
    reference = make_engine(model_dir, dtype="float32")
    params = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
    expected_low = reference.generate([PROMPT], params, use_tqdm=False)[0]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    expected_high = reference.generate([[9, 10, 11]], params, use_tqdm=False)[0]
    low = {"prompt": PROMPT, "max_tokens": 300, "temperature": 0, "ignore_eos": True}
    high = {"prompt": [9, 10, 11], "max_tokens": 8, "temperature": 0, "ignore_eos": True}

    async def scenario() -> tuple[str, dict]:
        async with priority_server.async_client() as http:
            started = asyncio.Event()

            async def stream_low() -> str:
                text = ""
                body = {**low, "stream": True, "priority": 5}
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            text += json.loads(line[6:])["choices"][0]["text"]
                            started.set()
                return text

            low_task = asyncio.create_task(stream_low())
            await asyncio.wait_for(started.wait(), 30)
            answer = (await http.post("/v1/completions", json={**high, "priority": 0})).json()
            return await low_task, answer

    with priority_server.client() as http:
        before = value(scrape(http), "num_preemptions", "_total")
        low_text, high_answer = asyncio.run(scenario())
        preemptions = value(scrape(http), "num_preemptions", "_total") - before
    # One slot: the high-priority request could only run by taking the low one's.
    assert preemptions == 1
    assert high_answer["choices"][0]["text"] == expected_high.text
    # The low one recomputed its KV and went on exactly as it would have.
    assert low_text == expected_low.text
    wait_for_free_blocks(priority_server)


@pytest.mark.parametrize("route", ["/v1/embeddings", "/v1/score", "/v1/rerank"])
def test_an_embedding_request_takes_its_priority(priority_server: LiveServer, route: str):
    """An embedding request of priority -1 preempts a running generation of priority 0
    (one of the same priority would wait for it, as it came later)."""
    low = {"prompt": PROMPT, "max_tokens": 300, "ignore_eos": True, "stream": True}

    async def scenario() -> tuple[int, str | None]:
        async with priority_server.async_client() as http:
            started = asyncio.Event()

            async def stream_low() -> str | None:
                finish_reason = None
                async with http.stream("POST", "/v1/completions", json=low) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            finish_reason = json.loads(line[6:])["choices"][0]["finish_reason"]
                            started.set()
                return finish_reason

            low_task = asyncio.create_task(stream_low())
            await asyncio.wait_for(started.wait(), 30)
            body = {**PRIORITY_ROUTES[route], "priority": -1}
            answer = await http.post(route, json=body)
            return answer.status_code, await low_task

    with priority_server.client() as http:
        before = value(scrape(http), "num_preemptions", "_total")
        status, low_end = asyncio.run(scenario())
        preemptions = value(scrape(http), "num_preemptions", "_total") - before
    assert status == 200 and low_end == "length"  # the generation went on to its end
    assert preemptions == 1
    wait_for_free_blocks(priority_server)


# ---- time limits ----


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_out_of_time_before_the_first_token(server: LiveServer, route: str):
    body = {"max_tokens": 5, "timeout": 1e-6}
    if route == "/v1/completions":
        body["prompt"] = PROMPT
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    with server.client() as http:
        before = scrape(http)
        response = http.post(route, json=body)
        assert response.status_code == 408
        error = response.json()["error"]
        assert error["code"] == "request_timeout" and "time limit" in error["message"]
        # Streamed, the answer has begun: it ends with a final "abort" chunk.
        with http.stream("POST", route, json={**body, "stream": True}) as stream:
            assert stream.status_code == 200
            chunks = sse_chunks(stream)
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finish[-1] == "abort" and all(f is None for f in finish[:-1])
        after = scrape(http)
        assert (
            value(after, "request_timeouts", "_total") - value(before, "request_timeouts", "_total")
            == 2
        )
        aborted = value(after, "request_success", "_total", finished_reason="abort")
        assert aborted - value(before, "request_success", "_total", finished_reason="abort") == 2
        # The server goes on serving.
        assert http.post(route, json={**body, "timeout": None}).status_code == 200
    wait_for_free_blocks(server)


def test_the_server_limit_ends_a_whole_answer_with_its_tokens(limited_server: LiveServer):
    with limited_server.client() as http:
        before = scrape(http)
        response = http.post("/v1/completions", json=long_request())
        assert response.status_code == 200
        answer = response.json()
        assert answer["choices"][0]["finish_reason"] == "length"
        assert 1 <= answer["usage"]["completion_tokens"] < LONG_MAX_TOKENS
        after = scrape(http)
        timeouts = value(after, "request_timeouts", "_total")
        assert timeouts - value(before, "request_timeouts", "_total") == 1
        length = value(after, "request_success", "_total", finished_reason="length")
        assert length - value(before, "request_success", "_total", finished_reason="length") == 1
    wait_for_free_blocks(limited_server)


def test_a_request_cannot_outlast_the_server_limit_in_a_stream(limited_server: LiveServer):
    body = long_request(timeout=100, stream=True, stream_options={"include_usage": True})
    body = {**body, "messages": [{"role": "user", "content": "hi"}]}
    del body["prompt"]
    with (
        limited_server.client() as http,
        http.stream("POST", "/v1/chat/completions", json=body) as stream,
    ):
        chunks = sse_chunks(stream)
    *answer, usage = chunks
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in answer)
    assert answer[-1]["choices"][0]["finish_reason"] == "length"
    assert 1 <= usage["usage"]["completion_tokens"] < LONG_MAX_TOKENS and text
    wait_for_free_blocks(limited_server)


def test_a_request_limit_shorter_than_the_server_one(server: LiveServer):
    # No server limit here: the request's own ends it.
    with server.client() as http:
        response = http.post("/v1/completions", json={**long_request(), "max_tokens": 480})
        assert response.json()["choices"][0]["finish_reason"] == "length"
        assert response.json()["usage"]["completion_tokens"] == 480  # no limit: all of it
        timed = http.post("/v1/completions", json={**long_request(timeout=0.1), "max_tokens": 480})
        assert timed.json()["usage"]["completion_tokens"] < 480
    wait_for_free_blocks(server)


@pytest.mark.parametrize("timeout", [0, -1, "soon"])
def test_a_bad_timeout_is_a_400(server: LiveServer, timeout):
    with server.client() as http:
        response = http.post("/v1/completions", json={"prompt": PROMPT, "timeout": timeout})
        assert response.status_code == 400 and response.json()["error"]["param"] == "timeout"
