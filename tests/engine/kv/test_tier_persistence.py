"""The disk tier keeps what the pool still holds: each block computed into the prefix
cache is written as it is computed (off the step), and a stop writes what disk lacks,
so that a restarted engine finds a whole prompt there, evicted or not."""

from __future__ import annotations

import pytest
from hetero_infer.engine import LLMEngine

from tests.engine.kv.tier_engines import (
    BLOCK_SIZE,
    assert_nothing_leaked,
    block_files,
    run_in_turn,
    tier_config,
    tiny_llama_run,
)

MODEL = "llama"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder, [prompt], [expected] = tiny_llama_run(tmp_path_factory, count=1, seed=5)
    return folder, prompt, expected


def serve_again(folder, prompt, expected, directory) -> dict:
    """A fresh engine on the directory serves the prompt, every full block of it but
    the last token's from disk; its stats."""
    engine = LLMEngine(tier_config(folder, MODEL, ram_slots=64, disk=directory))
    assert run_in_turn(engine, [prompt]) == [expected]
    stats = engine.memory_stats()
    assert stats["kv_tier_disk_hits"] == (len(prompt) - 1) // BLOCK_SIZE
    assert_nothing_leaked(engine)
    return stats


def test_a_computed_block_is_on_disk_without_an_eviction(tiny, tmp_path):
    """One prompt in a pool that holds it all: nothing is evicted, yet every computed
    block (the prompt's and the answer's but its last token) has its file; a second
    engine, started without the first stopping (as after a kill), finds them."""
    folder, prompt, expected = tiny
    first = LLMEngine(tier_config(folder, MODEL, ram_slots=64, disk=tmp_path))
    assert run_in_turn(first, [prompt]) == [expected]
    assert first.memory_stats()["kv_tier_ram_blocks"] == 0  # nothing evicted
    assert len(block_files(tmp_path)) == (len(prompt) + len(expected) - 1) // BLOCK_SIZE
    serve_again(folder, prompt, expected, tmp_path)


def test_a_stop_writes_what_disk_lacks(tiny, tmp_path, monkeypatch):
    """Blocks whose writes were dropped (a full queue) are written by the stop."""
    folder, prompt, expected = tiny
    first = LLMEngine(tier_config(folder, MODEL, ram_slots=64, disk=tmp_path))
    writer = first.runner.kv_cache.tiers.writer
    with monkeypatch.context() as patch:
        patch.setattr(writer, "max_pending_bytes", 0)  # every write dropped
        assert run_in_turn(first, [prompt]) == [expected]
    assert not block_files(tmp_path) and first.memory_stats()["kv_tier_disk_writes_dropped"] > 0
    first.shutdown()
    assert len(block_files(tmp_path)) == (len(prompt) + len(expected) - 1) // BLOCK_SIZE
    serve_again(folder, prompt, expected, tmp_path)
