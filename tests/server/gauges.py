"""The engine's gauges as /metrics exports them (vLLM's names), for tests that check a
server is idle again: nothing running or waiting, no KV block in use."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

IDLE_GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")


def gauges(http: httpx.Client) -> dict[str, float]:
    """The vllm: gauges of /metrics, by name without the prefix."""
    text = http.get("/metrics").text
    return {
        family.name.removeprefix("vllm:"): family.samples[0].value
        for family in text_string_to_metric_families(text)
        if family.type == "gauge" and family.samples
    }


def is_idle(http: httpx.Client) -> bool:
    """Whether no request runs or waits and no KV block is in use."""
    values = gauges(http)
    return all(values[name] == 0 for name in IDLE_GAUGES)
