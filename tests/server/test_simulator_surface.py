"""The surface llm-d's inference simulator defines for a vLLM model server (its routes
and its metric names), which llm-d's components are tested against: a live server with
a real engine serves each route and exposes each metric, the request histograms
counting what the requests did."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL_NAME

ROUTES = (
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"),
    ("GET", "/metrics"),
    ("GET", "/health"),
    ("GET", "/ready"),
)
METRICS = (
    "vllm:gpu_cache_usage_perc",
    "vllm:lora_requests_info",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:time_to_first_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_generation_tokens",
    "vllm:generation_tokens",
    "vllm:max_num_generation_tokens",
    "vllm:request_params_max_tokens",
    "vllm:request_prompt_tokens",
    "vllm:prompt_tokens",
    "vllm:request_success",
)


def scrape(url: str) -> dict[str, dict[str, float]]:
    """Each metric family's samples, by sample name (summed over labels)."""
    families: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        samples = families.setdefault(family.name, {})
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return families


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_each_route_is_served(server, method, path):
    response = httpx.request(method, f"{server.url}{path}", json={}, timeout=60)
    assert response.status_code not in (404, 405), response.text


def test_each_metric_counts_what_the_requests_did(server):
    before = scrape(server.url)
    body = {"model": MODEL_NAME, "max_tokens": 6, "ignore_eos": True, "temperature": 0}
    http = httpx.Client(base_url=server.url, timeout=60)
    completion = http.post("/v1/completions", json={**body, "prompt": "Hello there"}).json()
    chat = {**body, "messages": [{"role": "user", "content": "Hi"}], "n": 2, "max_tokens": 4}
    answer = http.post("/v1/chat/completions", json=chat).json()
    after = scrape(server.url)
    assert set(METRICS) <= set(after), set(METRICS) - set(after)

    def added(name: str, sample: str = "_sum") -> float:
        full = f"{name.removeprefix('vllm:')}{sample}"
        key = f"vllm:{full}"
        return after[name].get(key, 0.0) - before.get(name, {}).get(key, 0.0)

    prompts = completion["usage"]["prompt_tokens"] + 2 * answer["usage"]["prompt_tokens"]
    assert added("vllm:request_prompt_tokens") == prompts  # each choice, as vLLM's
    assert added("vllm:request_generation_tokens") == 6 + 2 * 4
    assert added("vllm:max_num_generation_tokens") == 6 + 4  # the most of a request's
    assert added("vllm:request_params_max_tokens") == 6 + 4
    assert added("vllm:request_params_max_tokens", "_count") == 2
    for phase in ("inference", "prefill", "decode"):
        assert added(f"vllm:request_{phase}_time_seconds", "_count") == 3
    phases = added("vllm:request_prefill_time_seconds") + added("vllm:request_decode_time_seconds")
    assert phases == pytest.approx(added("vllm:request_inference_time_seconds"))
    assert added("vllm:time_per_output_token_seconds", "_count") == added(
        "vllm:inter_token_latency_seconds", "_count"
    )
