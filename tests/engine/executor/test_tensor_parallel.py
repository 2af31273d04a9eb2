"""Tensor parallelism on the CPU with gloo: 2 ranks (this process and one it starts)
give the same greedy fp32 tokens as one process, on tiny models whose heads split
evenly (Mistral's 6 heads over 2 KV heads, Qwen2's 4 over 4 with q/k/v biases, a tied
lm_head and a vocabulary padded to split), under
preemption (a KV cache too small for the batch), by swap and by recompute, chunked
prefill, prefix-cache hits (a second pass), choices forked from one prompt (n) and
logprobs of sampled and prompt tokens. A model whose heads do not split is refused
before any rank starts."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.settings.exceptions import ConfigError

from tests.engine.test_exactness import random_prompts, shared_prefix_prompts
from tests.tiny_models import TINY_MODELS, save_tiny_model

MAX_TOKENS = 12
# 34 blocks of 8 tokens: far fewer than the batch needs at once, so sequences are
# preempted (as in test_exactness.py).
SMALL_CACHE = dict(block_size=8, max_num_blocks=35, max_model_len=272)
REGIMES = {
    # swap space and prompts in chunks of at most 64 tokens
    "mistral": dict(SMALL_CACHE, num_cpu_blocks=200, max_num_batched_tokens=64),
    "qwen2": dict(SMALL_CACHE, preemption_mode="recompute"),
    # q/k norms over each rank's heads; Gemma's sliding layers and scaled embedding
    "qwen3": dict(SMALL_CACHE, max_num_batched_tokens=64),
    "gemma3": dict(SMALL_CACHE, num_cpu_blocks=200),
    # soft-capped scores over each rank's heads, soft-capped logits after the gather
    "gemma2": dict(SMALL_CACHE, max_num_batched_tokens=64),
    # fused q/k/v and gate/up, each part split over the ranks
    "phi3": dict(SMALL_CACHE, max_num_batched_tokens=64),
}
# Qwen2's lm_head tied to its embedding, and a vocabulary that 2 ranks split only with a
# padding row (385 = 193 + 192): the padding's logit must never show.
CHECKPOINTS = {
    "mistral": {},
    "qwen2": dict(tie_word_embeddings=True, vocab_size=385),
    "qwen3": {},
    "gemma2": {},
    "gemma3": {},
    "phi3": {},
}


def requests(vocab: int) -> tuple[list[list[int]], list[SamplingParams]]:
    # 1 to 250 tokens, and 4 that share a 70-token prefix
    prompts = random_prompts(1, vocab)[::2] + shared_prefix_prompts(2, vocab)[:4]
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)] * len(prompts)
    # Logprobs of the sampled and the prompt tokens (their logits come from every rank),
    # and three choices forked from one prompt's blocks.
    params[3] = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=3)
    params[5] = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, prompt_logprobs=2)
    params[6] = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, n=3)
    return prompts, params


def close_logprobs(
    a: list[dict[int, float] | None] | None, b: list | None, tolerance: float = 3e-4
) -> bool:
    """Same tokens, logprobs within fp32 rounding (the ranks sum partial products: up to
    1.1e-4 apart on an AVX2 EPYC's sgemm); the -inf of a token a mask ruled out equals
    -inf."""
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(
        x is y
        or (
            x.keys() == y.keys()
            and all(math.isclose(x[k], y[k], rel_tol=0, abs_tol=tolerance) for k in x)
        )
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("name", sorted(REGIMES))
def test_two_ranks_give_one_process_tokens(name: str, tmp_path: Path):
    folder = save_tiny_model(name, tmp_path / name, **CHECKPOINTS[name])
    prompts, params = requests(TINY_MODELS[name]().vocab_size)
    config = EngineConfig(model=str(folder), dtype="float32", **REGIMES[name])
    reference = LLMEngine(config)
    expected = reference.generate(prompts, params, use_tqdm=False)

    engine = LLMEngine(config.replace(tensor_parallel_size=2))
    try:
        assert engine.workers is not None and len(engine.workers.processes) == 1
        # The second pass finds the first pass's blocks in the prefix cache.
        for _ in range(2):
            outputs = engine.generate(prompts, params, use_tqdm=False)
            assert len(outputs) == len(expected)
            for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
                assert out.token_ids == ref.token_ids, f"output {i} differs"
                assert out.finish_reason == ref.finish_reason
                assert close_logprobs(out.logprobs, ref.logprobs), f"output {i}'s logprobs"
                assert close_logprobs(out.prompt_logprobs, ref.prompt_logprobs), i
        stats = engine.metrics.as_dict()
        assert stats["num_preemptions"] > 0 and stats["max_batch_size"] > 1
        memory = engine.memory_stats()
        assert memory["prefix_cache_hits"] > 0
        if config.use_swap:
            assert memory["swapped_out_blocks"] > 0
        assert memory["used_blocks"] == 0 and memory["num_sequences"] == 0
        # The logits themselves, gathered from both ranks' vocabularies (the padding
        # row cut off): those of one process.
        hidden = torch.randn(3, reference.model_config.hidden_size)
        with torch.inference_mode():
            logits = engine.runner.compute_logits(hidden)
            assert logits.shape == (3, reference.model_config.vocab_size)
            torch.testing.assert_close(logits, reference.runner.compute_logits(hidden))
    finally:
        engine.shutdown()
    # The worker left on STOP, by itself.
    assert engine.workers is None


def test_heads_that_do_not_split_are_refused_before_any_rank_starts(tmp_path: Path):
    folder = save_tiny_model("llama", tmp_path / "llama")  # 3 heads, 1 KV head
    config = EngineConfig(model=str(folder), dtype="float32", tensor_parallel_size=2)
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        LLMEngine(config)
    assert "tensor_parallel_size 2" in str(refused.value)
    assert "attention heads (3), KV heads (1)" in str(refused.value)
    assert time.monotonic() - started < 10  # no rank was started and waited for


@pytest.mark.cpu_kernels("linear_packed")
def test_bf16_one_token_steps_stay_as_close_to_fp32_as_one_process(tmp_path: Path):
    """In bf16 the CPU runs one-token steps through its one-call decoder stack, where the
    shapes suit its kernels (multiples of 32, as here); with tensor parallelism the layers
    must run one by one, all-reducing between them. bf16 rounds, so the check is on the
    prompt logprobs' distance from fp32's: two ranks no further than one process."""
    folder = save_tiny_model(
        "mistral",
        tmp_path / "mistral",
        hidden_size=128,
        head_dim=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    )
    prompt = random_prompts(3, TINY_MODELS["mistral"]().vocab_size)[8]  # 33 tokens
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    # One prompt token a step: each step a decode-shaped one.
    config = EngineConfig(
        model=str(folder), max_num_batched_tokens=1, max_num_blocks=8, max_model_len=64
    )

    def prompt_logprobs(engine: LLMEngine) -> list[float]:
        try:
            out = engine.generate([prompt], params, use_tqdm=False)[0]
        finally:
            engine.shutdown()
        return [next(iter(entry.values())) for entry in out.prompt_logprobs[1:]]

    one_process = LLMEngine(config.replace(dtype="bfloat16"))
    assert one_process.runner.fast_path is not None  # the stack runs where its kernels do
    exact = prompt_logprobs(LLMEngine(config.replace(dtype="float32")))
    single = prompt_logprobs(one_process)
    split = prompt_logprobs(LLMEngine(config.replace(dtype="bfloat16", tensor_parallel_size=2)))

    def distance(values: list[float]) -> float:
        return sum(abs(a - b) for a, b in zip(values, exact, strict=True)) / len(exact)

    assert distance(split) < 2 * distance(single), (distance(split), distance(single))
