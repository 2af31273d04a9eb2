"""Greedy output equals transformers' generate, token for token, in fp32.

On tiny random checkpoints of each family (tests/tiny_models.py), for 16 prompts from 1 token to
several hundred, under every scheduling regime that changes how the KV cache is
filled: plain, chunked prefill, preemption by recompute, preemption by swap,
prefix-cache hits, and blocks brought back from the prefix cache's RAM and disk tiers.
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.reference import check_same_tokens, transformers_greedy
from tests.tiny_models import TINY_MODELS, save_tiny_model

MAX_NEW_TOKENS = 24
PROMPT_LENGTHS = [1, 2, 3, 7, 15, 16, 17, 31, 33, 50, 64, 100, 150, 200, 250, 300]
EOS = 2


def random_prompts(seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in PROMPT_LENGTHS]


def shared_prefix_prompts(seed: int, vocab: int) -> list[list[int]]:
    """16 prompts that share a 70-token prefix (4 full blocks of 16 and a bit)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(70)]
    return [prefix + [rng.randrange(3, vocab) for _ in range(n)] for n in range(1, 17)]


def reference_model(model_dir) -> torch.nn.Module:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def reference_outputs(
    model_dir, prompts: list[list[int]], one_batch: bool = True
) -> list[list[int]]:
    return transformers_greedy(
        reference_model(model_dir),
        prompts,
        MAX_NEW_TOKENS,
        batch_size=len(prompts) if one_batch else 1,
        eos_token_id=EOS,
        pad_token_id=0,
    )


@pytest.fixture(scope="module", params=sorted(TINY_MODELS))
def tiny(request, tmp_path_factory):
    """(model folder, prompts, transformers' outputs) per architecture."""
    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    vocab = TINY_MODELS[request.param]().vocab_size
    prompts = random_prompts(1, vocab) + shared_prefix_prompts(2, vocab)
    return folder, prompts, reference_outputs(folder, prompts)


def test_greedy_may_part_from_transformers_at_a_tie_alone(tmp_path):
    """check_same_tokens, which every regime below uses: another token than
    transformers' fails, unless its logit ties the best one within fp32 rounding."""
    folder = save_tiny_model("llama", tmp_path)
    prompt = random_prompts(3, TINY_MODELS["llama"]().vocab_size)[5]
    with torch.no_grad():
        logits = reference_model(folder)(torch.tensor([prompt])).logits[0, -1]
    best, second = logits.topk(2).indices.tolist()
    with pytest.raises(AssertionError, match="no tie"):
        check_same_tokens(folder, prompt, [second], [best])
    lifted = {second: float(logits[best] - logits[second])}  # now level with the best
    check_same_tokens(folder, prompt, [second], [best], lifted)


# Regimes: engine settings, and what must be seen in the stats for the regime to count.
REGIMES = {
    "plain": (dict(), None),
    "chunked": (dict(max_num_batched_tokens=40), None),
    # 40 blocks of 8 tokens = 320 tokens: far less than the batch needs at once.
    "recompute": (dict(block_size=8, max_num_blocks=41, max_model_len=328), "num_preemptions"),
    "swap": (
        dict(block_size=8, max_num_blocks=41, max_model_len=328, num_cpu_blocks=200),
        "num_preemptions",
    ),
}
# The matrices built on REGIMES for a feature around the forward pass (speculation,
# LoRA) run every regime on one model of each KV layout (global layers only; a
# sliding-window group of its own), and one regime on each other family, in turn: the
# feature's code is the same for every family, whose forward pass
# test_greedy_matches_transformers shows under every regime.
EVERY_REGIME = ("llama", "gemma3")


def skip_outside_family_regimes(family: str, regime: str, families: list[str]) -> None:
    """Skip unless ``family`` runs ``regime`` in such a matrix over ``families``: every
    regime for EVERY_REGIME's, one each for the rest, taking the regimes in turn so
    that each meets several families."""
    if family in EVERY_REGIME:
        return
    regimes = sorted(REGIMES)
    others = [f for f in families if f not in EVERY_REGIME]
    if regime != regimes[others.index(family) % len(regimes)]:
        pytest.skip(f"{regime} is shown on other families (EVERY_REGIME, and one each)")


# The recompute regime's small pool, with the prefix cache's tiers: the first pass's
# blocks are evicted to a few MiB of RAM and to disk (its directory added below), and
# the second pass takes them back while the pool is busy. The tiers move blocks as
# bytes: one model of each KV layout shows them. Not among REGIMES, which other files'
# matrices (speculation, LoRA) share.
TIERS = (
    dict(block_size=8, max_num_blocks=41, max_model_len=328, kv_offloading_size=0.004),
    "kv_tier_hit_tokens",
)


# Global layers only; and a sliding-window group of its own.
TIER_FAMILIES = ("llama", "gemma3")

# Async scheduling (the default with CUDA): each step handed over before the last one's
# tokens are applied, over chunked prefill and swap preemption (not among REGIMES:
# speculation's matrix shares them, and runs without it).
ASYNC = (
    dict(
        async_scheduling=True,
        block_size=8,
        max_num_blocks=41,
        max_model_len=328,
        num_cpu_blocks=200,
        max_num_batched_tokens=40,
    ),
    "num_preemptions",
)


@pytest.mark.parametrize("regime", [*sorted(REGIMES), "tiers", "async"])
def test_greedy_matches_transformers(tiny, regime, tmp_path, request):
    folder, prompts, expected = tiny
    settings, must_happen = {"tiers": TIERS, "async": ASYNC}.get(regime) or REGIMES[regime]
    if regime == "tiers":
        if request.node.callspec.params["tiny"] not in TIER_FAMILIES:
            pytest.skip("the tiers are shown on one model of each KV layout")
        settings = {**settings, "kv_offloading_dir": str(tmp_path)}
    config = EngineConfig(model=str(folder), dtype="float32", **settings)
    engine = LLMEngine(config)
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0)
    # The second pass finds the first pass's blocks in the prefix cache.
    for _ in range(2):
        outputs = engine.generate(prompts, params, use_tqdm=False)
        for prompt, out, ref in zip(prompts, outputs, expected, strict=True):
            check_same_tokens(folder, prompt, out.token_ids, ref)
            if out.token_ids == ref:
                assert out.finish_reason == ("stop" if ref[-1] == EOS else "length")
    assert engine.metrics.max_batch_size > 1
    if must_happen:
        assert {**engine.metrics.as_dict(), **engine.memory_stats()}[must_happen] > 0
    if regime == "swap":
        assert engine.memory_stats()["swapped_out_blocks"] > 0
    stats = engine.memory_stats()
    assert stats["prefix_cache_hits"] > 0
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0
    # Gemma's sliding-window layers keep their KV in a group of their own.
    assert stats.get("group1_used_blocks", 0) == 0
    assert ("group1_total_blocks" in stats) == (folder.name.startswith("gemma"))
