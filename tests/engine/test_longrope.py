"""LongRoPE (Phi-3) past its original context: a sequence's step takes the long
factors once its context passes the original one, as transformers' forward pass does,
so greedy output equals transformers' for prompts that stay below it and for prompts
past it from the start (prefilled in one step).

Not matched yet (docs/models.md): a sequence that crosses it while generating, where
transformers drops its cache and computes it again with the long factors (Phi-3's
prepare_inputs_for_generation) and the engine keeps the keys it rotated with the short
ones; and a prompt past it prefilled in chunks, whose chunks below it take the short
factors."""

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
    # Below it throughout (with the 24 tokens generated), past it at once.
    prompts = [p for p in random_prompts(5, 384) if len(p) in (15, 31, 100, 200, 250)]
    expected = reference_outputs(phi3_short_original, prompts)
    engine = LLMEngine(EngineConfig(model=str(phi3_short_original), dtype="float32"))
    model = engine.runner.model
    assert model.long_rope_after == ORIGINAL
    assert model.layer_ropes[0][0].shape[0] == 2 * engine.model_config.max_position_embeddings
    params = SamplingParams(max_tokens=24, temperature=0.0)
    outputs = engine.generate(prompts, params, use_tqdm=False)
    for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
        assert out.token_ids == ref, f"prompt {i} ({len(prompts[i])} tokens) differs"
    assert EOS not in [t for out in outputs for t in out.token_ids[:-1]]
