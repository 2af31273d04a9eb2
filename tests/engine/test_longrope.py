"""LongRoPE (Phi-3) past its original context: greedy output equals transformers' on
every path. A sequence past it takes the long factors for all its tokens, as
transformers' forward pass over its prompt does; one that crosses it while generating
starts again with them, as transformers drops its cache there (Phi-3's
prepare_inputs_for_generation); a prompt past it prefilled in chunks takes them from its
first chunk; and the prefix cache never serves keys rotated one way to a sequence
rotated the other (the block hashes are salted). transformers' reference runs one
prompt at a time: in a batch it takes the factors by the longest sequence for all."""

from __future__ import annotations

from pathlib import Path

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.engine.test_exactness import EOS, random_prompts, reference_outputs
from tests.tiny_models import longrope_parameters, save_tiny_model

ORIGINAL = 64


def save_phi3_with_short_original(folder: Path) -> Path:
    """The tiny Phi-3 with an original context of ORIGINAL positions."""
    parameters = {
        **longrope_parameters(head_dim=24),
        "original_max_position_embeddings": ORIGINAL,
        "partial_rotary_factor": 1.0,  # as the config's own standardizing adds it
    }
    return save_tiny_model(
        "phi3", folder, original_max_position_embeddings=ORIGINAL, rope_parameters=parameters
    )


@pytest.fixture(scope="module")
def phi3_short_original(tmp_path_factory) -> Path:
    return save_phi3_with_short_original(tmp_path_factory.mktemp("phi3"))


def test_long_factors_past_the_original_context(phi3_short_original: Path):
    # Below it throughout (with the 24 tokens generated), past it at once; and at its
    # edge: ORIGINAL tokens are within it (the first token generated after a prompt of
    # ORIGINAL - 1 is, the second is not), ORIGINAL + 1 past it.
    prompts = [p for p in random_prompts(5, 384) if len(p) in (15, 31, 100, 200, 250)]
    prompts += [prompts[-1][: ORIGINAL + n] for n in (-1, 0, 1)]
    expected = reference_outputs(phi3_short_original, prompts, one_batch=False)
    engine = LLMEngine(EngineConfig(model=str(phi3_short_original), dtype="float32"))
    model = engine.runner.model
    assert model.long_rope_after == ORIGINAL
    assert model.layer_ropes[0][0].shape[0] == 2 * engine.model_config.max_position_embeddings
    params = SamplingParams(max_tokens=24, temperature=0.0)
    outputs = engine.generate(prompts, params, use_tqdm=False)
    for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
        assert out.token_ids == ref, f"prompt {i} ({len(prompts[i])} tokens) differs"
    assert EOS not in [t for out in outputs for t in out.token_ids[:-1]]
    # Restarted once each, the two that crossed it while generating, and nothing else.
    assert engine.metrics.as_dict()["num_preemptions"] == 2


@pytest.mark.parametrize(
    "regime",
    [
        {},
        {"max_num_batched_tokens": 40},  # prompts past it, prefilled in chunks
        {"block_size": 8, "max_num_blocks": 41, "max_model_len": 328},  # recompute
        {
            "block_size": 8,
            "max_num_blocks": 41,
            "max_model_len": 328,
            "num_cpu_blocks": 200,
        },  # swap
    ],
    ids=["plain", "chunked", "recompute", "swap"],
)
def test_crossing_chunks_and_prefix_hits(phi3_short_original: Path, regime):
    """Prompts that cross the original context while generating (50 and 60 tokens, 24
    generated), past it in chunks (100, 200), and below it; then each again with a
    shared 48-token prefix (cached from the first pass, rotated short), and each once
    more (found in the cache, rotated as it is)."""
    rng_prompts = random_prompts(7, 384)
    base = [p for p in rng_prompts if len(p) in (15, 31, 50, 100, 200)]
    base.append(rng_prompts[-1][:60])
    shared = [base[-1][:48] + p[:n] for p, n in zip(base, (5, 40, 100, 150), strict=False)]
    prompts = base + shared
    expected = reference_outputs(phi3_short_original, prompts, one_batch=False)
    config = EngineConfig(model=str(phi3_short_original), dtype="float32", **regime)
    engine = LLMEngine(config)
    params = SamplingParams(max_tokens=24, temperature=0.0)
    for _ in range(2):
        outputs = engine.generate(prompts, params, use_tqdm=False)
        for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
            assert out.token_ids == ref, f"prompt {i} ({len(prompts[i])} tokens) differs"
    stats = engine.memory_stats()
    assert stats["prefix_cache_hits"] > 0
    assert engine.metrics.as_dict()["num_preemptions"] > 0  # the crossings restarted
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0
