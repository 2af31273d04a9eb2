"""kv_cache_prefault: the CPU's KV cache written once at start (as vLLM's zeroed cache),
so that no block's memory is faulted in when first used; off, blocks come in as used."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.worker.kv_cache import KVCache

from tests.tiny_models import save_tiny_model

CACHE_MIB = 128


def resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_prefault_makes_the_whole_cache_resident():
    # 2 layers x (K, V) x 1024 blocks of 16 x 64 fp32 values: 128 MiB.
    before = resident_mib()
    cache = KVCache(2, 1024, 0, (16, 1, 512), torch.float32, torch.device("cpu"))
    assert cache.device_blocks.nbytes == CACHE_MIB << 20
    assert resident_mib() - before < CACHE_MIB / 4  # lazily: nothing written yet
    cache.prefault()
    assert resident_mib() - before > CACHE_MIB * 0.9
    assert not cache.device_blocks.any()


def test_the_engine_prefaults_when_asked_and_answers_the_same(tmp_path, caplog):
    folder = str(save_tiny_model("llama", tmp_path))
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    lazy = LLMEngine(EngineConfig(model=folder, dtype="float32"))
    expected = [out.token_ids for out in lazy.generate(prompts, params, use_tqdm=False)]
    assert "KV cache written once" not in caplog.text
    with caplog.at_level(logging.INFO):
        engine = LLMEngine(EngineConfig(model=folder, dtype="float32", kv_cache_prefault=True))
    assert "KV cache written once" in caplog.text
    outputs = engine.generate(prompts, params, use_tqdm=False)
    assert [out.token_ids for out in outputs] == expected
