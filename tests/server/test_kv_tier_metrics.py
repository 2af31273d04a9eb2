"""/metrics: the prefix cache's tier counters, from a real engine's stats after blocks
came back from RAM and disk; none of them when the tiers are off."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hetero_infer.engine import LLMEngine
from hetero_infer.server.server_metrics import ServerMetrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.kv.tier_engines import prompts, run_in_turn, tier_config
from tests.tiny_models import TINY_MODELS, save_tiny_model


def scrape(engine: LLMEngine) -> dict[tuple[str, tuple], float]:
    view = SimpleNamespace(
        metrics=engine.metrics,
        memory_stats=engine.memory_stats,
        rejections={},
        block_size=engine.config.block_size,
        lora=None,
        lora_requests_info=engine.adapters.requests_info,
    )
    server = ServerMetrics()
    server.bind(lambda: view, "tiny")
    text = generate_latest(server.registry).decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def test_tier_counters_follow_the_engine(folder, tmp_path):
    engine = LLMEngine(tier_config(folder, "llama", ram_slots=16, disk=tmp_path))
    batch = prompts(TINY_MODELS["llama"]().vocab_size)
    run_in_turn(engine, batch + [batch[0]])
    stats, samples = engine.memory_stats(), scrape(engine)
    assert samples[("vllm:kv_tier_hits_total", (("tier", "disk"),))] == stats["kv_tier_disk_hits"]
    assert samples[("vllm:kv_tier_hits_total", (("tier", "ram"),))] == stats["kv_tier_ram_hits"]
    assert stats["kv_tier_disk_hits"] > 0
    written = samples[("vllm:kv_tier_bytes_total", (("direction", "in"), ("tier", "disk")))]
    assert written == stats["kv_tier_disk_bytes_written"] > 0
    hits = samples[("vllm:external_prefix_cache_hits_total", ())]
    assert 0 < hits == stats["kv_tier_hit_tokens"]
    assert samples[("vllm:kv_tier_disk_errors_total", (("kind", "corrupt"),))] == 0


def test_no_tier_counters_when_they_are_off(folder):
    samples = scrape(LLMEngine(tier_config(folder, "llama")))
    assert not [name for name, _ in samples if "kv_tier" in name or "external_prefix" in name]
