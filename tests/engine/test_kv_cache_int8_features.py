"""The int8 KV cache with swap and with tensor parallelism, in fp32 on tiny models.

The int8 cache rounds the KV, so its greedy tokens are measured against the same int8
cache without the feature, not against transformers:
- swap: a pool too small for the batch preempts sequences, whose blocks (values and
  the scales kept in each row) go to CPU memory and come back; the tokens are those of
  a pool that holds the whole batch;
- tensor parallelism: 2 ranks over gloo, each rounding its own KV heads, give the
  tokens and (within a few values rounded one int8 step apart) the logprobs of one
  process.
"""

from __future__ import annotations

import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.engine.executor import test_tensor_parallel_features as tp
from tests.engine.test_exactness import (
    MAX_NEW_TOKENS,
    REGIMES,
    random_prompts,
    shared_prefix_prompts,
)
from tests.tiny_models import TINY_MODELS, save_tiny_model

INT8 = dict(dtype="float32", kv_cache_dtype="int8")


def int8_blocks(engine: LLMEngine) -> bool:
    return all(k.dtype == torch.int8 for k, _ in engine.runner.kv_caches)


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_swap_brings_int8_blocks_back_as_they_were(name, tmp_path):
    """Global layers only, and sliding-window layers with blocks of their own."""
    folder = save_tiny_model(name, tmp_path)
    vocab = TINY_MODELS[name]().vocab_size
    # Up to 150 tokens, and 16 with a shared prefix: their answers outgrow the pool's 328
    # tokens while they decode together
    prompts = random_prompts(1, vocab)[:13] + shared_prefix_prompts(2, vocab)
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0)
    plain = LLMEngine(EngineConfig(model=str(folder), **INT8))
    expected = [out.token_ids for out in plain.generate(prompts, params, use_tqdm=False)]
    swap, _ = REGIMES["swap"]
    engine = LLMEngine(EngineConfig(model=str(folder), **INT8, **swap))
    assert int8_blocks(engine)
    assert engine.runner.kv_cache.groups[0].cpu_blocks.dtype == torch.int8
    outputs = engine.generate(prompts, params, use_tqdm=False)
    for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
        assert out.token_ids == ref, f"prompt {i} ({len(prompts[i])} tokens) differs"
    stats = engine.memory_stats()
    assert engine.metrics.num_preemptions > 0 and stats["swapped_out_blocks"] > 0
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0
    assert stats.get("group1_used_blocks", 0) == 0


def test_two_ranks_round_their_heads_as_one_process(tmp_path):
    folder = save_tiny_model(tp.NAME, tmp_path, vocab_size=tp.VOCAB)
    # 7, 33 and 100 tokens: one to four chunks of 32
    prompts = [random_prompts(4, tp.VOCAB)[i] for i in (3, 8, 11)]
    params = SamplingParams(max_tokens=16, temperature=0.0, logprobs=2)

    def run(engine: LLMEngine):
        assert int8_blocks(engine)
        outputs = engine.generate(prompts, params, use_tqdm=False)
        assert engine.memory_stats()["used_blocks"] == 0
        return outputs

    config = EngineConfig(model=str(folder), **{**tp.SETTINGS, **INT8})
    expected, got = tp.one_and_two_ranks(config, run)
    # The ranks sum their partial products in another order, so a cached value lying on
    # a half step can round to the next int8 step on one side: measured on an AVX-512
    # EPYC, up to 5.3e-3 apart (7e-4 on average), where the int8 cache itself moves these
    # logprobs 0.16-0.23 on average from the fp32 cache's. A rank rounding its heads
    # otherwise than one process would move them by the cache's own scale.
    tp.assert_same_generations(got, expected, tolerance=2e-2)
