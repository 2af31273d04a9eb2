"""The example router of deploy/kv-routing (routing by the replicas' KV events) in front
of two real servers, all as processes on loopback.

Each server's /metrics is the evidence: a chat prefix served once is found, by the
router's own hashes of the chat template's tokens, on the replica that computed it, and
the next request sharing it lands there and hits its cache; once that replica evicts
the prefix (other prompts sent to it directly) the router no longer finds it there;
the round-robin policy alternates.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port
from tests.server.conftest import (
    MODEL_NAME,
    REPO_ROOT,
    ServerProcess,
    spawn_installed,
    user_environment,
    wait_until,
)
from tests.tiny_models import save_tiny_model

pytestmark = pytest.mark.slow

ROUTER = REPO_ROOT / "deploy" / "kv-routing" / "router.py"
BLOCK_SIZE = 16  # the server's default
NUM_BLOCKS = 48  # a prefix is ~14 blocks: three filler prompts push it out
# ~220 tokens with the tiny byte-level tokenizer: 13 full blocks and then some.
PREFIX = "You answer questions about rivers and their deltas, briefly. " * 4


@dataclass
class Router:
    url: str
    process: subprocess.Popen
    log_path: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


@dataclass
class Fleet:
    replicas: list[ServerProcess]
    events: Router
    round_robin: Router


def spawn_replica(model_dir: Path, log_dir: Path) -> tuple[ServerProcess, str]:
    """A server publishing its KV events; with its --replica argument for the router."""
    events, replay = free_port(), free_port()
    # The server binds addresses with a wildcard (vLLM's rule); the router connects.
    settings = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": "kv",
    }
    args = [
        "--model", str(model_dir), "--served-model-name", MODEL_NAME,
        "--max-model-len", "512", "--max-num-blocks", str(NUM_BLOCKS),
        "--prefix-caching-hash-algo", "sha256_cbor",
        "--kv-events-config", json.dumps(settings),
    ]  # fmt: skip
    server = spawn_installed(args, log_dir, env={**user_environment(), "PYTHONHASHSEED": "0"})
    return server, f"{server.url},tcp://127.0.0.1:{events},tcp://127.0.0.1:{replay}"


def spawn_router(replicas: list[str], policy: str, model_dir: Path, log_dir: Path) -> Router:
    port = free_port()
    log_path = log_dir / f"router-{policy}.log"
    command = [sys.executable, str(ROUTER), "--policy", policy, "--port", str(port)]
    command += ["--tokenizer", str(model_dir)]
    for replica in replicas:
        command += ["--replica", replica]
    with open(log_path, "wb") as log:
        env = {**user_environment(), "PYTHONHASHSEED": "0"}
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    return Router(f"http://127.0.0.1:{port}", process, log_path)


def wait_ready(router: Router) -> None:
    def ready() -> bool:
        if router.process.poll() is not None:
            raise AssertionError(f"the router exited:\n{router.log_path.read_text()}")
        try:
            return httpx.get(f"{router.url}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, 120, "the router to replay the replicas' events", interval=0.1)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    model_dir = save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))
    log_dir = tmp_path_factory.mktemp("kv-routing-logs")
    spawned = [spawn_replica(model_dir, log_dir) for _ in range(2)]
    replicas = [server for server, _ in spawned]
    routers: list[Router] = []
    try:
        # All five load side by side; the routers wait for the replicas' replay sockets.
        routers = [
            spawn_router([arg for _, arg in spawned], policy, model_dir, log_dir)
            for policy in ("events", "round-robin")
        ]
        with ThreadPoolExecutor() as pool:
            list(pool.map(lambda r: r.wait_ready(), replicas))
            list(pool.map(wait_ready, routers))
        yield Fleet(replicas, *routers)
    finally:
        for router in routers:
            router.stop()
        for replica in replicas:
            replica.kill()


def prefix_hits(replica: ServerProcess) -> float:
    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:prefix_cache_hits_total"
    )


def chat_body(question: str) -> dict:
    messages = [{"role": "system", "content": PREFIX}, {"role": "user", "content": question}]
    return {"model": MODEL_NAME, "messages": messages, "max_tokens": 2, "temperature": 0}


def chat(url: str, question: str) -> httpx.Response:
    response = httpx.post(f"{url}/v1/chat/completions", json=chat_body(question), timeout=60)
    assert response.status_code == 200, response.text
    return response


def held(router: Router, body: dict) -> dict[str, int]:
    """How many of the prompt's leading blocks the router finds on each replica."""
    return httpx.post(f"{router.url}/router/match", json=body, timeout=10).json()["held"]


def test_a_prefix_goes_back_to_the_replica_that_computed_it(fleet: Fleet) -> None:
    replicas = {r.url: r for r in fleet.replicas}
    first = chat(fleet.events.url, "Which river is longest?")
    holder = replicas[first.headers["x-replica"]]
    other = next(r for r in fleet.replicas if r is not holder)
    matched, full_blocks = map(int, first.headers["x-prefix-blocks"].split("/"))
    assert matched == 0 and full_blocks >= 12
    # The router learns of the blocks from the holder's events, sent after its step.
    body = chat_body("Which river is longest?")
    wait_until(lambda: held(fleet.events, body)[holder.url] == full_blocks, 10, "the events")
    assert held(fleet.events, body)[other.url] == 0

    before = {r.url: prefix_hits(r) for r in fleet.replicas}
    second = chat(fleet.events.url, "And which is widest?")
    assert second.headers["x-replica"] == holder.url
    # The router found every block the two prompts share (all but where they part) ...
    matched, total = map(int, second.headers["x-prefix-blocks"].split("/"))
    assert total >= full_blocks - 1 and matched >= full_blocks - 2, (matched, total)
    # ... and so did the holder's cache: the router's hashes are the server's.
    assert prefix_hits(holder) - before[holder.url] >= matched * BLOCK_SIZE
    assert prefix_hits(other) == before[other.url]

    # Prompts sent to the holder directly push the prefix out of its cache; its
    # BlockRemoved events take the blocks out of the router's view too.
    for i in range(3):
        filler = {"model": MODEL_NAME, "prompt": f"Filler {i}. " * 40, "max_tokens": 2}
        assert httpx.post(f"{holder.url}/v1/completions", json=filler, timeout=60).is_success
    wait_until(lambda: held(fleet.events, body)[holder.url] == 0, 10, "the evictions")


def test_round_robin_alternates(fleet: Fleet) -> None:
    served = []
    for i in range(4):
        body = {"model": MODEL_NAME, "prompt": f"Question {i}?", "max_tokens": 2}
        response = httpx.post(f"{fleet.round_robin.url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        served.append(response.headers["x-replica"])
    assert served[0] != served[1] and served[::2] == [served[0]] * 2
    assert served[1::2] == [served[1]] * 2
