"""Gemma-3-270M as Q4_K_M (the packaged model ``gemma-3-270m``): our engine against
transformers on the same GGUF file.

Both load the file and dequantize it to fp32; greedy tokens must be identical for 8
prompts (chat, through Gemma's template, and raw; 1 token to ~700, past the 512-token
window of its sliding layers), also when the KV cache is small enough to force
preemption, prompts are chunked, and prefixes are shared. Teacher-forced on a fixed
text, bf16's logprobs and the int8 KV cache's stay close to fp32's (the measures
test_quantized_smollm2.py uses, and why).
"""

from __future__ import annotations

import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine
from hetero_infer.engine.loader import resolve_model, with_family_chat
from hetero_infer.kernels.linear_quantized import QuantizedLinear

from tests.engine.test_quantized_smollm2 import (
    QUANTIZED_KERNEL,
    TEXT,
    logprob_change,
    perplexity_change,
    teacher_forced,
)
from tests.engine.test_smollm2 import (
    DOCUMENT,
    MAX_NEW_TOKENS,
    REGIMES,
    build_prompts,
    check_greedy_in_regime,
)
from tests.reference import transformers_from_gguf, transformers_greedy

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
SLIDING_WINDOW = 512
# Of SmolLM2's prompts (test_smollm2.py), one of each kind: two chats sharing the
# template's start, two sharing a long prefix, the few-hundred-token chat, the one-token
# and the code prompt. transformers takes ~4 s a prompt for this model's 262k-row
# logits, and its other cases repeat these kinds.
PROMPT_KINDS = [0, 1, 6, 7, 10, 11, 13]


@pytest.fixture(scope="module")
def reference():
    """(prompts, transformers' greedy outputs) for Gemma loaded from the same GGUF."""
    tokenizer, model = transformers_from_gguf(resolve_model(MODEL))
    # The file carries no chat template: the engine gives its tokenizer Gemma's, and
    # ends a turn at <end_of_turn> too.
    assert with_family_chat(tokenizer, "Gemma3ForCausalLM") == (106,)
    assert model.config.sliding_window == SLIDING_WINDOW
    prompts = [build_prompts(tokenizer)[i] for i in PROMPT_KINDS]
    prompts.append(tokenizer(DOCUMENT * 8)["input_ids"])
    assert max(len(p) for p in prompts) > SLIDING_WINDOW
    return prompts, transformers_greedy(model, prompts, MAX_NEW_TOKENS, batch_size=4)


def engine_for(dtype: str, **settings) -> LLMEngine:
    return LLMEngine(EngineConfig(model=MODEL, dtype=dtype, **settings))


# The real file under preemption and chunks, which cut its prompts across the sliding
# window, in one pass (its prompts that share a prefix find it cached); each other
# regime, and a whole second pass from the prefix cache, is checked on the tiny Gemma 3
# (test_exactness.py), as this model's 262k-row logits make each pass costly.
def test_gemma3_greedy_matches_transformers(reference):
    regime = "recompute+chunked"
    engine = engine_for("float32", **REGIMES[regime])
    assert engine.model_config.sliding_windows.count(SLIDING_WINDOW) == 15
    check_greedy_in_regime(engine, *reference, regime, passes=1)


# Teacher-forced on twice the text: 809 tokens, past the sliding layers' window.
TEXT_PAST_WINDOW = TEXT + "\n\n" + TEXT
SCORING = dict(max_num_blocks=512, max_model_len=2048)


@pytest.fixture(scope="module")
def fp32_teacher_forced() -> list[float]:
    return teacher_forced(engine_for("float32", **SCORING), TEXT_PAST_WINDOW)


@pytest.mark.skipif(
    not QUANTIZED_KERNEL,
    reason="without the quantized kernel this is bf16 on dequantized weights alone: "
    "test_quantized_smollm2.py's case",
)
def test_bf16_stays_close_to_fp32_teacher_forced(fp32_teacher_forced):
    """bf16 on the file's blocks kept for the quantized kernel (the MLP's Q5_0 and Q6_K;
    q/k/v mix Q5_0 and Q8_0, so they are dequantized), as the model is served: bf16's
    own rounding and the kernel's together (bf16 alone on dequantized weights is
    test_quantized_smollm2.py's, on SmolLM2)."""
    engine = engine_for("bfloat16", quantization="gguf", **SCORING)
    mlp = [layer.mlp for layer in engine.runner.model.layers]
    assert all(isinstance(m.down_proj.packed, QuantizedLinear) for m in mlp)
    assert all(isinstance(m.gate_up_proj.packed.linear, QuantizedLinear) for m in mlp)
    assert all(m.down_proj.packed.activation_bits == 16 for m in mlp)
    assert all(m.gate_up_proj.packed.linear.activation_bits == 16 for m in mlp)
    logprobs = teacher_forced(engine)
    # the text's tokens are the first of TEXT_PAST_WINDOW's
    fp32 = fp32_teacher_forced[: len(logprobs)]
    # Measured (404 tokens): bf16 on the dequantized weights, mean |change| 0.033 nats,
    # perplexity +0.04% (AVX2, torch's bf16 kernels).
    # Kept quantized the kernel rounds the projections' activations to 16 bits per 32
    # values, as Gemma's normed activations have outlier channels
    # (Family.activation_outliers), and the lm_head's to int8: each token's logprob
    # 0.049 off fp32's (rms; bf16 0.043-0.046, the mean |change| 0.72x the rms here).
    # int8 activations in the projections made it 0.078 (rms; mean ~0.056, perplexity
    # +1.02%): the bound sits between bf16's error and that one.
    change = logprob_change(fp32, logprobs)
    assert change < 0.05, change
    assert abs(perplexity_change(fp32, logprobs)) < 0.005


def test_int8_kv_stays_close_to_the_unrounded_cache_teacher_forced(fp32_teacher_forced):
    """The int8 KV cache on the sliding layers too, in fp32, where the cache's rounding is
    the only one that differs (test_kv_cache_int8.py has the why, and SmolLM2's cases).
    Measured (809 tokens; keys rotated, a scale per 32 values): mean |change| 0.0072
    nats, perplexity +0.00%; one bit fewer doubles the change, past this bound."""
    engine = engine_for("float32", kv_cache_dtype="int8", **SCORING)
    assert all(k.dtype == torch.int8 for k, _ in engine.runner.kv_caches)
    int8 = teacher_forced(engine, TEXT_PAST_WINDOW)
    change = logprob_change(fp32_teacher_forced, int8)
    assert change < 0.012, change
    assert abs(perplexity_change(fp32_teacher_forced, int8)) < 0.01
