"""Tensor parallelism over several machines, started as Kubernetes' LeaderWorkerSet
starts SGLang: every node runs `hetero-infer serve` with the same flags but its own
--node-rank. Here the two "nodes" are two processes on 127.0.0.1, each the installed
command as a user runs it: node 0 serves, node 1 runs only its rank, and together they
answer with the text one process gives; node 1 leaves once node 0 is stopped."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.ports import free_port
from tests.server.conftest import ServerProcess, spawn_installed, wait_until
from tests.tiny_models import save_tiny_model

pytestmark = pytest.mark.slow

PROMPT = "Hello there"
MAX_TOKENS = 12
# A small KV cache: the default budget (2 GiB) takes seconds to allocate on each rank.
ENGINE_FLAGS = ["--dtype", "float32", "--max-num-blocks", "16", "--max-model-len", "64"]
STARTUP_TIMEOUT = 180.0
EXIT_TIMEOUT = 60.0


def node_args(folder: Path, tp: int, node_rank: int, init_port: int) -> list[str]:
    return [
        "--model",
        str(folder),
        *ENGINE_FLAGS,
        "--tensor-parallel-size",
        str(tp),
        "--nnodes",
        "2",
        "--node-rank",
        str(node_rank),
        "--dist-init-addr",
        f"127.0.0.1:{init_port}",
    ]


def one_process_text(folder: Path) -> str:
    config = EngineConfig(model=str(folder), dtype="float32", max_num_blocks=16, max_model_len=64)
    engine = LLMEngine(config)
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
        return engine.generate(PROMPT, params, use_tqdm=False)[0].text
    finally:
        engine.shutdown()


def wait_ready(leader: ServerProcess, worker: ServerProcess) -> None:
    """Until node 0's /readyz says 200, failing at once if either node exits first."""

    def ready() -> bool:
        for name, node in (("node 0", leader), ("node 1", worker)):
            if node.process.poll() is not None:
                raise AssertionError(
                    f"{name} exited with {node.process.returncode} before node 0 was ready:\n"
                    f"node 0:\n{leader.log()[-4000:]}\nnode 1:\n{worker.log()[-4000:]}"
                )
        try:
            return httpx.get(f"{leader.url}/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, STARTUP_TIMEOUT, "node 0 to be ready", interval=0.2)


@pytest.mark.parametrize(
    ("tp", "signalled"),
    [(2, ("node 0",)), (4, ("node 0", "node 1"))],
    ids=["one-rank-a-node,stop-node-0", "two-ranks-a-node,stop-the-group"],
)
def test_two_nodes_serve_one_process_text(tp: int, signalled: tuple[str, ...], tmp_path: Path):
    # Qwen2's 4 heads and 4 KV heads split over 2 and over 4 ranks.
    folder = save_tiny_model("qwen2", tmp_path / "qwen2")
    expected = one_process_text(folder)
    init_port = free_port()
    # Node 1 first, as LeaderWorkerSet may start a worker before its leader: it waits.
    worker = spawn_installed(node_args(folder, tp, 1, init_port), tmp_path)
    leader = spawn_installed(node_args(folder, tp, 0, init_port), tmp_path)
    nodes = {"node 0": leader, "node 1": worker}
    try:
        wait_ready(leader, worker)
        body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
        response = httpx.post(f"{leader.url}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == expected
        assert worker.process.poll() is None
        # Node 1 has no server of its own: its --port was never listened on.
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{worker.url}/healthz", timeout=5)

        # Stopping node 0 stops the group: node 1's ranks leave on its stop command.
        # Kubernetes deleting the group signals every pod at once: node 1 then waits
        # for node 0's drain and stop all the same.
        for name in signalled:
            nodes[name].process.send_signal(signal.SIGTERM)
        assert leader.process.wait(timeout=EXIT_TIMEOUT) == 0, leader.log()[-4000:]
        assert worker.process.wait(timeout=EXIT_TIMEOUT) == 0, worker.log()[-4000:]
        assert "rank 0 stopped the group" in worker.log()
    finally:
        for node in nodes.values():
            node.kill()


def test_a_second_signal_ends_a_nodes_ranks_at_once(tmp_path: Path):
    """A worker whose leader never came: the first SIGTERM waits for a stop that will
    not come, the second ends its ranks and itself at once."""
    folder = save_tiny_model("qwen2", tmp_path / "qwen2")
    worker = spawn_installed(node_args(folder, 4, 1, free_port()), tmp_path)
    try:
        wait_until(lambda: "started ranks 2, 3" in worker.log(), 120, "node 1's ranks")
        worker.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM: waiting up to 35 s" in worker.log(), 30, "the first signal")
        assert worker.process.poll() is None
        worker.process.send_signal(signal.SIGTERM)
        assert worker.process.wait(timeout=EXIT_TIMEOUT) == 128 + signal.SIGTERM
        ranks = [int(pid) for pid in worker.log().split("(pids ")[1].split(")")[0].split(", ")]
        for pid in ranks:  # ended and reaped by node 1 itself
            assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode
    finally:
        worker.kill()
