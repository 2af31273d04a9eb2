"""The int8 KV cache (``kv_cache_dtype="int8"``) against the unrounded one on the real
models: teacher-forced on a fixed text (tests/engine/test_quantized_smollm2.py's
measure), the perplexity stays within 1% and the next-token picks agree at 99% or more.

The picks are compared with fp32 activations, where the cache's rounding is the only
one that differs: the unrounded cache is then fp32, a stricter reference than a bf16
cache (which itself agrees with it at 99.75%). With bf16 activations the same measure
says more about bf16 than about the cache: SmolLM2 flips 3% of its picks between two
bf16 kernels for the same attention (the C++ and the torch one), with an unrounded
cache, so the bf16 runs are held to their measured levels. Greedy free-running output
is not compared token for token: a near-tie anywhere flips the rest of a generation.
"""

from __future__ import annotations

import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine

from tests.engine.test_quantized_smollm2 import TEXT, agreement, teacher_forced

pytestmark = pytest.mark.slow

# Gemma-3-270M's sliding layers see 512 tokens: twice the text reaches past them.
MODELS = {"smollm2": (None, TEXT), "gemma-3-270m": ("gemma-3-270m", TEXT + "\n\n" + TEXT)}
# Measured top-1 agreement with the unrounded cache (a scale per 32 values, keys
# rotated): fp32 activations 99.5% (SmolLM2, 404 of 406 tokens; Gemma, 805 of 809);
# bf16 96.3% and 98.3%. Perplexity within 0.1%, but SmolLM2 in bf16 +0.85%. Each rate
# moves by a token or two with the order of the kernel's sums; SmolLM2 in bf16 95.1% on
# a Cascade Lake Xeon, where its unrounded cache's prefill takes the tiled kernel and
# the int8 one per-token rows.
LEAST_AGREEMENT = {
    ("smollm2", "float32"): 0.99,
    ("gemma-3-270m", "float32"): 0.99,
    ("smollm2", "bfloat16"): 0.945,
    ("gemma-3-270m", "bfloat16"): 0.975,
}


def engine_for(model: str | None, dtype: str, kv_cache_dtype: str) -> LLMEngine:
    config = EngineConfig(
        model=model,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        max_num_blocks=512,
        max_model_len=2048,
    )
    return LLMEngine(config)


@pytest.mark.parametrize(("name", "dtype"), sorted(LEAST_AGREEMENT))
def test_int8_kv_matches_the_unrounded_cache_teacher_forced(name, dtype):
    model, text = MODELS[name]
    ppl_ref, top_ref = teacher_forced(engine_for(model, dtype, "auto"), text)
    engine = engine_for(model, dtype, "int8")
    assert all(k.dtype == torch.int8 for k, _ in engine.runner.kv_caches)
    ppl, top = teacher_forced(engine, text)
    assert abs(ppl / ppl_ref - 1) < 0.01, (ppl, ppl_ref)
    assert agreement(top, top_ref) >= LEAST_AGREEMENT[name, dtype]
