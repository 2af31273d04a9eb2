"""The embedded SmolLM2-135M-Instruct: our engine against transformers on the same GGUF.

Both load the Q4_1 file and dequantize it to fp32, to the same tensors; greedy tokens
must be identical for 16 prompts (chat and raw, 1 token to a few hundred), also when the KV cache is
small enough to force preemption, prompts are chunked, and prefixes are shared.
"""

from __future__ import annotations

import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.loader import load_state_dict, resolve_model

from tests.reference import transformers_from_gguf, transformers_greedy

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 24

DOCUMENT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
    "It is named after the engineer Gustave Eiffel, whose company designed and built the "
    "tower from 1887 to 1889. Locally nicknamed La dame de fer, it was constructed as the "
    "centrepiece of the 1889 World's Fair, and to crown the centennial anniversary of the "
    "French Revolution. "
)
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Who built the tower?",
    "Name three primary colours.",
    "Explain photosynthesis in one sentence.",
    "What is 12 times 7?",
]


def build_prompts(tokenizer) -> list[list[int]]:
    def chat(text: str) -> list[int]:
        messages = [{"role": "user", "content": text}]
        return list(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    prompts = [chat(q) for q in QUESTIONS]  # share the template's system prefix
    prompts += [chat(DOCUMENT + q) for q in QUESTIONS[:4]]  # share a long prefix
    prompts.append(chat(DOCUMENT * 3 + "Summarise the text."))  # a few hundred tokens
    raw = ["Paris", "Once upon a time", "def fibonacci(n):", DOCUMENT, "1, 2, 3, 4,"]
    prompts += [tokenizer(text)["input_ids"] for text in raw]
    prompts[-5] = prompts[-5][:1]  # a one-token prompt
    return prompts


@pytest.fixture(scope="module")
def transformers_smollm2():
    """(tokenizer, fp32 model) as transformers loads the GGUF file (~25 s on 2 cores, so
    once for this file's tests)."""
    return transformers_from_gguf(resolve_model(None))


def test_gguf_state_dict_matches_transformers(transformers_smollm2):
    """Our loader's tensors (dequantized, q/k rows un-permuted, renamed) are exactly the
    ones transformers loads from the file."""
    ours = load_state_dict(resolve_model(None), torch.float32)
    reference = transformers_smollm2[1].state_dict()
    # lm_head is tied to the embedding in SmolLM2: the GGUF has no output.weight.
    assert set(ours) == set(reference) - {"lm_head.weight"}
    for name, tensor in ours.items():
        assert tensor.shape == reference[name].shape, name
        assert torch.equal(tensor, reference[name]), name


@pytest.fixture(scope="module")
def reference(transformers_smollm2):
    """(prompts, transformers' greedy outputs) for SmolLM2 loaded from the same GGUF."""
    tokenizer, model = transformers_smollm2
    prompts = build_prompts(tokenizer)
    assert len(prompts) == 16 and max(len(p) for p in prompts) > 200
    return prompts, transformers_greedy(model, prompts, MAX_NEW_TOKENS, batch_size=4)


# Swap moves blocks as bytes whatever the weights: the tiny Llama, SmolLM2's family,
# shows it (test_exactness.py).
REGIMES = {
    "plain": dict(),
    # 48 blocks of 16 = 768 tokens for ~2,000 tokens of work; 64-token chunks.
    "recompute+chunked": dict(max_num_blocks=48, max_model_len=768, max_num_batched_tokens=64),
}


# A second pass, from the prefix cache, in the plain regime; under preemption and
# under chunks the tiny models show it (test_exactness.py).
@pytest.mark.parametrize("regime", list(REGIMES))
def test_smollm2_greedy_matches_transformers(reference, regime):
    engine = LLMEngine(EngineConfig(dtype="float32", **REGIMES[regime]))
    check_greedy_in_regime(engine, *reference, regime, passes=2 if regime == "plain" else 1)


def check_greedy_in_regime(
    engine: LLMEngine,
    prompts: list[list[int]],
    expected: list[list[int]],
    regime: str,
    passes: int = 2,
) -> None:
    """The engine's greedy tokens are ``expected`` in each pass (the second from the
    prefix cache), prompts found their shared prefixes in the prefix cache, and the
    regime's preemptions happened."""
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0)
    # A second pass finds the first pass's blocks in the prefix cache.
    for _ in range(passes):
        outputs = engine.generate(prompts, params, use_tqdm=False)
        for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
            assert out.token_ids == ref, f"prompt {i} ({len(prompts[i])} tokens) differs"
    stats = engine.memory_stats()
    assert stats["prefix_cache_hits"] > 0
    if regime != "plain":
        assert engine.metrics.num_preemptions > 0
    assert stats["used_blocks"] == 0 and stats["cpu_used_blocks"] == 0


def test_smollm2_answers_the_capital_of_france():
    engine = LLMEngine()
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer with one word."}]
    )
    out = engine.generate(prompt, SamplingParams(max_tokens=30, temperature=0.0))[0]
    assert "Paris" in out.text and out.finish_reason == "stop"
