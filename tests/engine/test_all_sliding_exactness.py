"""A model whose every layer slides: greedy fp32 output equals transformers' generate,
token for token, on prompts longer than the window.

The tiny Mistral (tests/tiny_models.py) with ``sliding_window`` set, as Mistral-7B-v0.1
had it: without ``layer_types`` every layer then attends to the last WINDOW tokens, in
transformers (its sliding-window mask) as in the engine (ModelConfig.sliding_windows).
Such a model keeps one KV cache group (worker/kv_cache.py: no global layers to hold a
sliding group's tables), so the window is applied by the attention alone, where Gemma's
mixed layers (test_exactness.py, test_sliding_window_memory.py) have a group of their
own. The window, 20 tokens, is no multiple of the blocks' 16 or 8 tokens: it starts
inside a block. Prompts are 1 to 300 tokens (and 70-token shared prefixes), and each
generation of 24 tokens takes the shorter ones past the window too.
"""

from __future__ import annotations

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.engine.test_exactness import (
    EOS,
    MAX_NEW_TOKENS,
    REGIMES,
    random_prompts,
    reference_outputs,
    shared_prefix_prompts,
)
from tests.tiny_models import TINY_MODELS, save_tiny_model

WINDOW = 20
NUM_LAYERS = TINY_MODELS["mistral"]().num_hidden_layers


@pytest.fixture(scope="module")
def sliding_mistral(tmp_path_factory):
    """(model folder, prompts, transformers' outputs) for the tiny Mistral whose layers
    all see WINDOW tokens."""
    folder = save_tiny_model("mistral", tmp_path_factory.mktemp("mistral"), sliding_window=WINDOW)
    # The same weights attending globally (the seed draws them; the window is no weight).
    unwindowed = save_tiny_model("mistral", tmp_path_factory.mktemp("mistral_global"))
    vocab = TINY_MODELS["mistral"]().vocab_size
    prompts = random_prompts(3, vocab) + shared_prefix_prompts(4, vocab)
    expected = reference_outputs(folder, prompts)
    # transformers applies the window here (else the comparison would not test it): its
    # outputs part from the global ones' wherever a prompt and its tokens pass the window
    # by a few tokens, and never before.
    global_outputs = reference_outputs(unwindowed, prompts)
    for prompt, ref, other in zip(prompts, expected, global_outputs, strict=True):
        parted = next((i for i, (a, b) in enumerate(zip(ref, other, strict=False)) if a != b), None)
        # The token after position WINDOW - 1 is the first whose attention differs.
        assert parted is None or len(prompt) + parted > WINDOW
        if len(prompt) > WINDOW + 8:
            assert parted is not None, f"{len(prompt)}-token prompt: the window changed nothing"
    return folder, prompts, expected


# Each regime changes where a step starts and ends against the window: chunks of 40
# tokens, and prompts recomputed after preemption in blocks of 8 (plain and swap add
# little here beyond what test_exactness.py runs on every family). Every regime's
# second pass takes the first's prompts' blocks from the prefix cache, so the window is
# read across cached and computed blocks.
@pytest.mark.parametrize("regime", ["chunked", "recompute"])
def test_all_sliding_greedy_matches_transformers(sliding_mistral, regime):
    folder, prompts, expected = sliding_mistral
    settings, must_happen = REGIMES[regime]
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32", **settings))
    assert engine.model_config.sliding_windows == (WINDOW,) * NUM_LAYERS
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0)
    for _ in range(2):
        outputs = engine.generate(prompts, params, use_tqdm=False)
        for prompt, out, ref in zip(prompts, outputs, expected, strict=True):
            assert out.token_ids == ref, f"{len(prompt)}-token prompt"
            assert out.finish_reason == ("stop" if ref[-1] == EOS else "length")
    stats = {**engine.metrics.as_dict(), **engine.memory_stats()}
    assert stats["prefix_cache_hits"] > 0
    if must_happen:
        assert stats[must_happen] > 0
    # One group: the layers' KV shares the global pool.
    assert "group1_total_blocks" not in stats
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0
