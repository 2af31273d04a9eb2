"""Two replicas behind the cache-aware router (sglang-router), all three real processes
on loopback, as "Replicas behind a router" in docs/deployment.md runs them.

What each replica's own /metrics says is the evidence: after a long prompt prefix has
been served once, every later request sharing it lands on the replica that served it
(that replica's request count and prefix-cache hits grow, the other's do not), the
prefixes spread over both replicas, and once a replica dies the router sends every
request, its prefixes too, to the one left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.router import RouterProcess, start_router
from tests.server.conftest import MODEL_NAME, ServerProcess, spawn_server, wait_until
from tests.tiny_models import save_tiny_model

pytestmark = pytest.mark.slow

BLOCK_SIZE = 16  # the server's default, and so the prefix cache's unit
# Four system-prompt-like prefixes, long enough to fill many KV blocks each (the tiny
# model's tokenizer spends a token on about every one or two characters), and unlike
# from their first word, so the router's prefix trees tell them apart.
PREFIXES = [
    f"{topic} " * 5
    for topic in (
        "Answer questions about the geography of rivers, mountains and coasts.",
        "Translate the text below from French into formal German, keeping names.",
        "Summarize the meeting notes that follow as three short, concrete points.",
        "Write verses about the sea as an old sailor would tell them at the port.",
    )
]
FOLLOWERS = 3  # requests per prefix after the first


@dataclass
class Fleet:
    replicas: list[ServerProcess]
    router: RouterProcess


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    model_dir = save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))
    log_dir = tmp_path_factory.mktemp("fleet-logs")
    replicas = [spawn_server(model_dir, log_dir) for _ in range(2)]
    router = None
    try:
        for replica in replicas:  # they load side by side
            replica.wait_ready()
        router = start_router([r.url for r in replicas], log_dir)
        yield Fleet(replicas, router)
    finally:
        if router is not None:
            router.stop()
        for replica in replicas:
            replica.kill()


def counters(replica: ServerProcess) -> dict[str, float]:
    """A replica's finished requests and prefix-cache tokens, from its /metrics."""
    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    totals = {"requests": 0.0, "hits": 0.0, "queries": 0.0}
    names = {
        "vllm:request_success_total": "requests",
        "vllm:prefix_cache_hits_total": "hits",
        "vllm:prefix_cache_queries_total": "queries",
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                totals[names[sample.name]] += sample.value
    return totals


def complete(client: httpx.Client, prompt: str) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    return client.post("/v1/completions", json=body)


def cached_tokens_at_least(replica: ServerProcess, prefix: str) -> int:
    """Prompt tokens a request starting with ``prefix`` must find cached on a replica
    that holds it: the prefix's full blocks, less one for where prefix and suffix meet."""
    tokens = httpx.post(
        f"{replica.url}/tokenize", json={"model": MODEL_NAME, "prompt": prefix}, timeout=10
    ).json()["count"]
    return (tokens // BLOCK_SIZE - 1) * BLOCK_SIZE


def seed(router: RouterProcess) -> None:
    """Each prefix's first request, all at once: with no replica holding any of them,
    the router sends each to the least-loaded replica, so they spread over both."""

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=router.url, timeout=60) as client:
            bodies = [
                {"model": MODEL_NAME, "prompt": f"{prefix}First.", "max_tokens": 48}
                | {"ignore_eos": True}
                for prefix in PREFIXES
            ]
            return await asyncio.gather(
                *(client.post("/v1/completions", json=body) for body in bodies)
            )

    for response in asyncio.run(main()):
        assert response.status_code == 200, response.text


def test_the_router_lists_the_served_model(fleet: Fleet) -> None:
    """The router answers /v1/models itself, with the model each replica's
    /server_info names (without it, "unknown")."""
    models = httpx.get(f"{fleet.router.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [MODEL_NAME]


def test_requests_sharing_a_prefix_land_on_the_replica_that_holds_it(fleet: Fleet) -> None:
    seed(fleet.router)
    holders: list[int] = []
    with httpx.Client(base_url=fleet.router.url, timeout=60) as client:
        for prefix in PREFIXES:
            before = [counters(r) for r in fleet.replicas]
            for i in range(FOLLOWERS):
                response = complete(client, f"{prefix}Question {i}?")
                assert response.status_code == 200, response.text
            after = [counters(r) for r in fleet.replicas]
            served = [a["requests"] - b["requests"] for a, b in zip(after, before, strict=True)]
            hits = [a["hits"] - b["hits"] for a, b in zip(after, before, strict=True)]
            # All of this prefix's requests went to one replica, and none to the other.
            assert sorted(served) == [0, FOLLOWERS], (prefix[:30], served)
            holder = served.index(FOLLOWERS)
            holders.append(holder)
            # Every one of them, the first included, found the prefix in that replica's
            # cache: the replica already held it, from the prefix's first request.
            floor = cached_tokens_at_least(fleet.replicas[holder], prefix)
            assert floor >= 8 * BLOCK_SIZE
            assert hits[holder] >= FOLLOWERS * floor, (prefix[:30], hits, floor)
            assert hits[1 - holder] == 0
    # The router spread the prefixes: each replica holds some (cache-aware, not sticky).
    assert set(holders) == {0, 1}, holders


def test_a_replica_that_dies_is_routed_around(fleet: Fleet) -> None:
    """Runs after the test above (it kills a replica of the shared fleet)."""
    dead, survivor = fleet.replicas
    before = counters(survivor)
    dead.kill()
    prompts = [f"{prefix}After the failure {i}." for prefix in PREFIXES for i in range(2)]
    with httpx.Client(base_url=fleet.router.url, timeout=60) as client:
        for prompt in prompts:
            response = complete(client, prompt)
            assert response.status_code == 200, (response.status_code, response.text)
            assert response.json()["choices"][0]["text"] is not None
    assert counters(survivor)["requests"] - before["requests"] == len(prompts)
    wait_until(
        lambda: fleet.router.readiness().get("healthy_workers") == 1,
        30,
        "the router to count the dead replica out",
        interval=0.2,
    )
