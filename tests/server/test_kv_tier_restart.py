"""The prefix cache outlives a restart, as a user meets it: `hetero-infer serve` with a
disk tier, one long prompt, SIGTERM, the same command again, the same prompt: its
blocks come from disk (the metrics say so) and the answer is the same."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL_NAME

BLOCK_SIZE = 16  # the server's default
PROMPT = "The quick brown fox jumps over the lazy dog. " * 12


def disk_hits(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:kv_tier_hits_total" and sample.labels["tier"] == "disk":
                return sample.value
    raise AssertionError("no disk tier hits in /metrics")


def test_the_prefix_cache_outlives_a_restart(server_process_factory, tmp_path):
    args = ("--kv-offloading-size", "0.05", "--kv-offloading-dir", str(tmp_path / "kv"))
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    answers, hits = [], []
    for _ in range(2):
        server = server_process_factory(*args)
        server.wait_ready()
        response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        answers.append(response.json())
        hits.append(disk_hits(server.url))
        server.terminate()
        assert server.process.wait(timeout=60) == 0, server.log()
    prompt_tokens = answers[0]["usage"]["prompt_tokens"]
    assert prompt_tokens > 4 * BLOCK_SIZE
    # Nothing was evicted, so nothing reached disk by eviction: the first run's blocks
    # were written as they were computed (or by the stop), and the second finds every
    # full block of the prompt but the last token's.
    assert hits == [0, (prompt_tokens - 1) // BLOCK_SIZE]
    assert answers[1]["choices"][0]["text"] == answers[0]["choices"][0]["text"]
