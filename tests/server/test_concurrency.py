"""Many clients at once: they share the engine's batches and get the right text, and
clients that go away mid-generation give their KV blocks back at once."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
from hetero_infer.engine.params.sampling_params import SamplingParams
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL_NAME, LiveServer, wait_until
from tests.server.gauges import is_idle
from tests.server.stable_prompts import STABLE_PROMPTS

NUM_STREAMS = 16
NUM_DISCONNECTS = 50
LONG_MAX_TOKENS = 400


def successes(http: httpx.Client) -> dict[str, float]:
    """vllm:request_success_total by finish reason."""
    text = http.get("/metrics").text
    return {
        sample.labels["finished_reason"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "vllm:request_success"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def test_concurrent_streams_share_batches(server: LiveServer, reference_engine):
    prompts = STABLE_PROMPTS
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    expected = [out.text for out in reference_engine.generate(prompts, params, use_tqdm=False)]
    server.engine.metrics.max_batch_size = 0  # the engine is idle: count this test's batches

    async def one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, str | None]:
        stream = await client.completions.create(
            model=MODEL_NAME,
            prompt=prompt,
            max_tokens=48,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        text, finish_reason = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            finish_reason = chunk.choices[0].finish_reason or finish_reason
        return text, finish_reason

    async def main():
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120
        ) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    results = asyncio.run(main())
    assert len(results) == NUM_STREAMS
    assert [text for text, _ in results] == expected
    assert all(reason == "length" for _, reason in results)
    assert server.engine.metrics.max_batch_size > 1


def test_disconnects_free_everything(server: LiveServer, reference_engine):
    """50 clients (half streaming) go away mid-generation; nothing stays allocated."""
    async_engine = server.state.engine
    generated_before = server.engine.metrics.tokens_generated
    with server.client() as http:
        successes_before = successes(http)
    body = {
        "model": MODEL_NAME,
        "prompt": "Hello world and the",
        "max_tokens": LONG_MAX_TOKENS,
        "ignore_eos": True,
    }

    async def streaming(http: httpx.AsyncClient, got_tokens: asyncio.Event) -> int:
        chunks = 0
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    assert choice["finish_reason"] is None, "finished before the disconnect"
                    chunks += 1
                    if chunks == 3:
                        got_tokens.set()
                        await asyncio.sleep(3600)  # hold the stream open until cancelled
        return chunks

    async def main() -> None:
        limits = httpx.Limits(max_connections=NUM_DISCONNECTS + 5)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as http:
            events = [asyncio.Event() for _ in range(NUM_DISCONNECTS // 2)]
            tasks = [asyncio.create_task(streaming(http, ev)) for ev in events]
            tasks += [
                asyncio.create_task(http.post("/v1/completions", json=body))
                for _ in range(NUM_DISCONNECTS - len(events))
            ]

            async def all_in_flight() -> None:
                while async_engine.num_pending < NUM_DISCONNECTS:
                    await asyncio.sleep(0.02)
                for event in events:
                    await event.wait()

            await asyncio.wait_for(all_in_flight(), timeout=120)
            assert not any(t.done() for t in tasks), "a request ended before its client left"
            for task in tasks:
                task.cancel()  # httpx closes each connection
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    with server.client() as http:
        # About a second is the target; the deadline is generous for a loaded CI machine.
        wait_until(lambda: is_idle(http), 10, "the aborted requests' blocks to be freed")
        assert async_engine.num_pending == 0
        # Aborted, not run to the end: each counted as such, and nothing runs on.
        after = successes(http)
        added = {k: v - successes_before.get(k, 0.0) for k, v in after.items()}
        assert {k: v for k, v in added.items() if v} == {"abort": NUM_DISCONNECTS}
        assert not server.engine.has_pending_work()
        assert server.engine.metrics.tokens_generated - generated_before < (
            NUM_DISCONNECTS * LONG_MAX_TOKENS
        )
        # A new request after all that runs normally.
        expected = reference_engine.generate(
            "Hello world", SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False
        )[0]
        out = http.post(
            "/v1/completions",
            json={"model": MODEL_NAME, "prompt": "Hello world", "max_tokens": 8, "temperature": 0},
        )
        assert out.status_code == 200
        assert out.json()["choices"][0]["text"] == expected.text
        assert successes(http)["length"] == after.get("length", 0.0) + 1
