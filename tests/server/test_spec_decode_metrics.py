"""/metrics: speculative decoding's counters under vLLM's names, from the engine's stats."""

from __future__ import annotations

from types import SimpleNamespace

from hetero_infer.engine.entrypoints.metrics import EngineMetrics
from hetero_infer.server.server_metrics import ServerMetrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

STATS = dict.fromkeys(
    ("num_running", "num_waiting", "num_swapped", "usage", "prefix_cache_queries"), 0
) | {"prefix_cache_hits": 0, "total_blocks": 64, "cpu_total_blocks": 0}


def _scrape(metrics: EngineMetrics) -> dict[str, list]:
    engine = SimpleNamespace(
        metrics=metrics,
        memory_stats=lambda: STATS,
        rejections={},
        block_size=16,
        lora=None,
        lora_requests_info=lambda: ([], []),
    )
    server = ServerMetrics()
    server.bind(lambda: engine, "tiny")
    text = generate_latest(server.registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_spec_decode_counters_follow_the_engine():
    metrics = EngineMetrics()
    metrics.spec_decode.num_speculative_tokens = 3
    metrics.spec_decode.record(3, 2)
    metrics.spec_decode.record(2, 0)
    families = _scrape(metrics)

    def value(name: str, **labels: str) -> float:
        (sample,) = [
            s
            for s in families[name]
            if s.name == name + "_total" and labels.items() <= s.labels.items()
        ]
        assert sample.labels["model_name"] == "tiny"
        return sample.value

    assert value("vllm:spec_decode_num_drafts") == 2
    assert value("vllm:spec_decode_num_draft_tokens") == 5
    assert value("vllm:spec_decode_num_accepted_tokens") == 2
    per_position = "vllm:spec_decode_num_accepted_tokens_per_pos"
    assert [value(per_position, position=str(p)) for p in range(3)] == [1, 1, 0]
    assert metrics.as_dict()["spec_decode_acceptance_rate"] == 2 / 5


def test_no_spec_decode_counters_when_it_is_off():
    families = _scrape(EngineMetrics())
    assert "vllm:generation_tokens" in families
    assert not [name for name in families if "spec_decode" in name]
