"""LoRA adapters with the engine's other features, in fp32 on the tiny Llama.

- n-gram drafts and a draft model (the base model, without the adapters): the drafted
  tokens are verified by the target with each row's adapter, so greedy output is the
  same as without speculation;
- the prefix cache's tiers (host RAM and disk): the same prompt under the base model
  and two adapters, its blocks evicted from a small pool and found again in the tiers,
  gives transformers' tokens on PEFT's merged weights each time: an adapter's blocks
  are salted by it, never served to the base model or another adapter;
- the int8 KV cache: the same tokens as the int8 cache without LoRA on the merged
  weights (the rounding the cache adds is then the same).
"""

from __future__ import annotations

import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.engine.kv.tier_engines import GREEDY, assert_nothing_leaked, tier_config, written
from tests.engine.kv.tier_engines import prompts as tier_prompts
from tests.engine.test_lora_exactness import ADAPTERS
from tests.engine.test_spec_decode import LOOPING_BIAS, SPEC, repeated_span_prompts
from tests.helpers import make_byte_fallback_tokenizer
from tests.lora_adapters import merged_model, save_adapter
from tests.reference import transformers_greedy
from tests.tiny_models import TINY_MODELS, save_tiny_model

NAME = "llama"
VOCAB = TINY_MODELS[NAME]().vocab_size
USED = ("all", "attn")
# Prompt i runs with ASSIGNED[i % 3] (None: the base model).
ASSIGNED = ["all", None, "attn"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """(model folder, {adapter name: folder}) for the tiny Llama."""
    root = tmp_path_factory.mktemp(NAME)
    folder = save_tiny_model(NAME, root / "model")
    adapters = {name: save_adapter(folder, root / name, **ADAPTERS[name]) for name in USED}
    return folder, adapters


def load_adapters(engine: LLMEngine, adapters: dict) -> LLMEngine:
    for name, path in adapters.items():
        engine.adapters.load(name, str(path))
    return engine


def lora_config(folder, **settings) -> EngineConfig:
    return EngineConfig(
        model=str(folder), dtype="float32", enable_lora=True, max_loras=2, **settings
    )


def drafted_requests() -> tuple[list[list[int]], list[SamplingParams], list[str | None]]:
    """Repeating prompts, plain and with LOOPING_BIAS (drafts accepted and rejected),
    each with an adapter or none."""
    prompts = repeated_span_prompts(3, VOCAB)
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logit_bias=bias)
        for bias in ({}, LOOPING_BIAS)
        for _ in prompts
    ]
    prompts = prompts * 2
    assigned = [ASSIGNED[i % len(ASSIGNED)] for i in range(len(prompts))]
    return prompts, params, assigned


@pytest.fixture(scope="module")
def undrafted(case):
    """The LoRA engine's outputs without speculation, and the requests."""
    folder, adapters = case
    prompts, params, assigned = drafted_requests()
    engine = load_adapters(LLMEngine(lora_config(folder)), adapters)
    outputs = engine.generate(prompts, params, use_tqdm=False, lora_request=assigned)
    expected = [out.token_ids for out in outputs]
    # The adapters matter: the same requests on the base model go otherwise.
    base = engine.generate(prompts, params, use_tqdm=False)
    with_adapter = [i for i, a in enumerate(assigned) if a is not None]
    changed = sum(base[i].token_ids != expected[i] for i in with_adapter)
    assert changed >= 0.75 * len(with_adapter)
    return prompts, params, assigned, expected


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_drafts_are_verified_with_each_rows_adapter(case, undrafted, method):
    folder, adapters = case
    prompts, params, assigned, expected = undrafted
    spec = SPEC if method == "ngram" else {"model": str(folder), "num_speculative_tokens": 4}
    engine = load_adapters(LLMEngine(lora_config(folder, speculative_config=spec)), adapters)
    for _ in range(2):  # the second pass finds the first's blocks in the prefix cache
        outputs = engine.generate(prompts, params, use_tqdm=False, lora_request=assigned)
        for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
            assert out.token_ids == ref, f"request {i} ({assigned[i]}) differs"
    stats = engine.metrics.spec_decode
    assert stats.num_accepted_tokens > 0, "no draft was ever accepted: nothing was tested"
    assert stats.num_draft_tokens > stats.num_accepted_tokens, "no draft was ever rejected"
    assert engine.metrics.max_batch_size > 1
    memory = engine.memory_stats()
    assert memory["prefix_cache_hits"] > 0
    assert memory["used_blocks"] == 0 and memory["num_sequences"] == 0


def test_tiers_never_serve_an_adapters_blocks_to_another(case, tmp_path):
    """Four prompts in turn, each under an adapter or none, so that the later ones
    evict the earlier ones' blocks to host RAM (16 slots) and disk; then A again under
    the base model and the other adapter (only A's blocks of adapter "all" are in the
    tiers: served to them, they would change their tokens), then under "all" itself,
    whose blocks come back from the tiers."""
    folder, adapters = case
    a, b, c, d = tier_prompts(VOCAB)
    runs = [(a, "all"), (b, None), (c, "attn"), (d, "all")]
    runs += [(a, None), (a, "attn"), (d, None), (a, "all"), (b, "all"), (b, None)]
    expected = {}
    for name in (None, *USED):
        model = merged_model(folder, adapters.get(name))
        mine = [p for p, adapter in runs if adapter == name]
        outs = transformers_greedy(model, mine, GREEDY.max_tokens, eos_token_id=None)
        expected.update({(tuple(p), name): out for p, out in zip(mine, outs, strict=True)})
    config = tier_config(folder, NAME, ram_slots=16, disk=tmp_path, enable_lora=True, max_loras=2)
    engine = load_adapters(LLMEngine(config), adapters)
    tier_hits = []
    for i, (prompt, name) in enumerate(runs):
        before = engine.memory_stats()["kv_tier_hit_tokens"]
        out = engine.generate([prompt], GREEDY, use_tqdm=False, lora_request=[name])[0]
        assert out.token_ids == expected[tuple(prompt), name], f"run {i} ({name}) differs"
        written(engine)
        tier_hits.append(engine.memory_stats()["kv_tier_hit_tokens"] - before)
    assert tier_hits[7] > 0, "A under 'all' again: its blocks are in the tiers"
    stats = engine.memory_stats()
    assert stats["kv_tier_ram_hits"] > 0 and stats["kv_tier_disk_hits"] > 0
    assert_nothing_leaked(engine)


def save_merged(folder, adapter, out):
    merged_model(folder, adapter).save_pretrained(out)
    make_byte_fallback_tokenizer().save_pretrained(out)
    return out


def test_int8_kv_cache_with_adapters(case, tmp_path):
    """The int8 cache's LoRA engine, a mixed batch twice (prefix-cache hits on the
    second pass), against the int8 cache without LoRA on each adapter's merged weights."""
    folder, adapters = case
    prompts, params, assigned = drafted_requests()
    expected: list[list[int] | None] = [None] * len(prompts)
    for name in (None, *USED):
        model = folder if name is None else save_merged(folder, adapters[name], tmp_path / name)
        engine = LLMEngine(EngineConfig(model=str(model), dtype="float32", kv_cache_dtype="int8"))
        mine = [i for i, a in enumerate(assigned) if a == name]
        outs = engine.generate(
            [prompts[i] for i in mine], [params[i] for i in mine], use_tqdm=False
        )
        for i, out in zip(mine, outs, strict=True):
            expected[i] = out.token_ids
    engine = load_adapters(LLMEngine(lora_config(folder, kv_cache_dtype="int8")), adapters)
    assert all(k.dtype == torch.int8 for k, _ in engine.runner.kv_caches)
    for _ in range(2):
        outputs = engine.generate(prompts, params, use_tqdm=False, lora_request=assigned)
        for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
            assert out.token_ids == ref, f"request {i} ({assigned[i]}) differs"
    memory = engine.memory_stats()
    assert memory["prefix_cache_hits"] > 0
    assert memory["used_blocks"] == 0 and memory["num_sequences"] == 0
