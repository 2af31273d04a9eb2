"""The model-server protocol of the Gateway API Inference Extension, checked against a
live server's /metrics: what the endpoint picker (deploy/k8s/inference-pool) reads
from each pod, under the vLLM names it looks for by default.

The protocol (the extension's docs/proposals/003-model-server-protocol) asks for:

| protocol name        | type  | vLLM name                  | used by                   |
| TotalQueuedRequests  | gauge | vllm:num_requests_waiting  | queue-scorer              |
| TotalRunningRequests | gauge | vllm:num_requests_running  | running-requests scorer   |
| KVCacheUtilization   | gauge | vllm:kv_cache_usage_perc   | kv-cache-utilization      |
| BlockSize, NumGPUBlocks (optional) | labels of vllm:cache_config_info | prefix-cache |
| LoRA adapters        | gauge, labels max_lora, running_lora_adapters,          |
|                      | waiting_lora_adapters, value a timestamp: vllm:lora_requests_info |

The picker parses the text with Prometheus' own parser and, of several series of a
family, keeps one (the newest by timestamp, which a server without timestamps leaves
to the first): so each family here must have exactly one series.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL_NAME, LiveServer, start_server, wait_until
from tests.tiny_models import save_tiny_model

API_KEY = "picker-test-key"
GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
LORA_LABELS = {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server with an API key, as in Kubernetes: the picker scrapes without one."""
    model_dir = save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))
    live = start_server(model_dir, api_key=API_KEY)
    yield live
    live.stop()


def scrape(live: LiveServer) -> dict:
    """Family name -> family, as the picker scrapes it (no Authorization header)."""
    response = httpx.get(f"{live.url}/metrics", timeout=10)
    assert response.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(response.text)}


def only_sample(families: dict, name: str):
    assert name in families, f"{name} is not exported"
    family = families[name]
    assert family.type == "gauge", (name, family.type)
    (sample,) = family.samples
    return sample


def test_every_metric_the_picker_reads_is_a_single_gauge(server: LiveServer) -> None:
    families = scrape(server)
    for name in GAUGES:
        only_sample(families, name)
    assert 0 <= only_sample(families, "vllm:kv_cache_usage_perc").value <= 1

    cache = only_sample(families, "vllm:cache_config_info")
    assert cache.value == 1
    stats = server.engine.memory_stats()
    assert int(cache.labels["block_size"]) == server.engine.config.block_size
    assert int(cache.labels["num_gpu_blocks"]) == stats["total_blocks"] > 0

    lora = only_sample(families, "vllm:lora_requests_info")
    assert lora.labels.keys() >= LORA_LABELS
    # No adapters are served: none loaded, none waiting, room for none.
    assert int(lora.labels["max_lora"]) == 0
    assert lora.labels["running_lora_adapters"] == lora.labels["waiting_lora_adapters"] == ""
    assert lora.value > 0  # a Unix time, which the picker compares across series


def test_the_gauges_follow_the_load(server: LiveServer) -> None:
    """While a long generation runs, the picker sees it running and holding KV blocks;
    when it ends, both go back to zero."""
    started = threading.Event()
    body = {"model": MODEL_NAME, "prompt": "Hello " * 40, "max_tokens": 300}
    body |= {"ignore_eos": True, "stream": True}
    auth = {"Authorization": f"Bearer {API_KEY}"}

    def stream() -> None:
        with (
            httpx.Client(base_url=server.url, timeout=120) as client,
            client.stream("POST", "/v1/completions", json=body, headers=auth) as response,
        ):
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    started.set()

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert started.wait(60), "the stream did not start"
        families = scrape(server)
        assert only_sample(families, "vllm:num_requests_running").value == 1
        assert only_sample(families, "vllm:kv_cache_usage_perc").value > 0
        assert only_sample(families, "vllm:num_requests_waiting").value == 0
    finally:
        thread.join(timeout=120)

    def idle() -> bool:
        families = scrape(server)
        running = only_sample(families, "vllm:num_requests_running").value
        return running == 0 and only_sample(families, "vllm:kv_cache_usage_perc").value == 0

    wait_until(idle, 30, "the gauges to go back to zero")
