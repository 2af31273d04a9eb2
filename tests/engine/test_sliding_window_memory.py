"""Gemma's sliding-window layers keep only their window's KV, and a chat's next turn
still finds its last turn's blocks: on a tiny random Gemma 3 through the engine, token
for token as transformers (test_exactness.py covers every scheduling regime)."""

from __future__ import annotations

import random

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.engine.test_exactness import reference_outputs
from tests.tiny_models import TINY_MODELS, save_tiny_model

WINDOW = 8
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return save_tiny_model("gemma3", tmp_path_factory.mktemp("gemma3"), sliding_window=WINDOW)


def engine_for(folder) -> LLMEngine:
    config = EngineConfig(
        model=str(folder), dtype="float32", block_size=BLOCK_SIZE, max_num_batched_tokens=64
    )
    return LLMEngine(config)


def test_sliding_layers_hold_only_the_window(gemma3):
    engine = engine_for(gemma3)
    rng = random.Random(0)
    vocab = TINY_MODELS["gemma3"]().vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (90, 150, 40)]
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=str(i))
    outputs = {}
    peak_global = peak_sliding = 0
    while engine.has_pending_work():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.token_ids
        stats = engine.memory_stats()
        peak_global = max(peak_global, stats["used_blocks"])
        peak_sliding = max(peak_sliding, stats["group1_used_blocks"])
    # The global layers hold every token (up to 210 a sequence); the sliding ones a
    # window's blocks and the one after, and the prompt's last window, besides the
    # step's chunk (64 tokens at most).
    assert peak_global >= (150 + 59) // BLOCK_SIZE
    per_sequence = 2 * -(-(WINDOW - 1) // BLOCK_SIZE) + 2
    assert peak_sliding <= 3 * per_sequence + 64 // BLOCK_SIZE
    assert engine.memory_stats()["group1_used_blocks"] == 0
    expected = reference_outputs(gemma3, prompts)
    for i, ref in enumerate(expected):  # transformers' run stops at eos or 24 tokens
        assert outputs[str(i)][: len(ref)] == ref


def test_next_turn_reuses_the_last_turns_blocks(gemma3):
    engine = engine_for(gemma3)
    rng = random.Random(1)
    vocab = TINY_MODELS["gemma3"]().vocab_size
    turn1 = [rng.randrange(3, vocab) for _ in range(300)]
    params = SamplingParams(max_tokens=20, temperature=0.0)
    answer = engine.generate([turn1], params, use_tqdm=False)[0].token_ids
    before = engine.memory_stats()["prefix_cache_hits"]
    turn2 = turn1 + answer + [rng.randrange(3, vocab) for _ in range(30)]
    out = engine.generate([turn2], params, use_tqdm=False)[0].token_ids
    hits = engine.memory_stats()["prefix_cache_hits"] - before
    # Every full block of turn 1's prompt and answer but the last (its KV was never
    # computed: the last answer token is not fed back), found in both groups.
    assert hits == (len(turn1) + len(answer) - 1) // BLOCK_SIZE * BLOCK_SIZE
    ref = reference_outputs(gemma3, [turn2])[0]
    assert out == ref[: len(out)]
