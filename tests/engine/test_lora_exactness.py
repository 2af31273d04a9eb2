"""LoRA adapters mixed in one batch: greedy fp32 output equals transformers on PEFT's
merged weights, token for token, for each adapter and for the base model's rows beside
them, under the scheduling regimes of test_exactness (plain, chunked prefill, preemption by
recompute and by swap; every regime on one model of each KV layout, one on Qwen2:
skip_outside_family_regimes) and with prefix-cache hits (a second pass), on prompts
that share a prefix across adapters.
"""

from __future__ import annotations

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.engine.test_exactness import (
    EOS,
    MAX_NEW_TOKENS,
    REGIMES,
    random_prompts,
    shared_prefix_prompts,
    skip_outside_family_regimes,
)
from tests.lora_adapters import merged_model, save_adapter
from tests.reference import transformers_greedy
from tests.tiny_models import TINY_MODELS, save_tiny_model

# Llama (GQA, tied embeddings), Gemma 3 (GeGLU, q/k norms, sliding layers), Qwen2 (biases)
MODELS = ["llama", "gemma3", "qwen2"]
# name -> what the adapter changes: every projection, attention only (rsLoRA), the MLP only
ADAPTERS = {
    "all": dict(seed=11, rank=8),
    "attn": dict(seed=12, rank=4, modules=["q_proj", "v_proj", "o_proj"], use_rslora=True),
    "mlp": dict(seed=13, rank=16, alpha=8, modules=["gate_proj", "up_proj", "down_proj"]),
}
# Prompt i runs with ASSIGNED[i % 4] (None: the base model).
ASSIGNED = ["all", None, "attn", "mlp"]


def reference(model_dir, adapter_dir, prompts):
    model = merged_model(model_dir, adapter_dir)
    return transformers_greedy(
        model, prompts, MAX_NEW_TOKENS, batch_size=len(prompts), eos_token_id=EOS, pad_token_id=0
    )


@pytest.fixture(scope="module", params=MODELS)
def lora_case(request, tmp_path_factory):
    """(model folder, adapter folders, prompts, each prompt's adapter, expected outputs)"""
    root = tmp_path_factory.mktemp(request.param)
    folder = save_tiny_model(request.param, root / "model")
    adapters = {name: save_adapter(folder, root / name, **spec) for name, spec in ADAPTERS.items()}
    vocab = TINY_MODELS[request.param]().vocab_size
    prompts = random_prompts(1, vocab) + shared_prefix_prompts(2, vocab)
    assigned = [ASSIGNED[i % len(ASSIGNED)] for i in range(len(prompts))]
    expected: list[list[int] | None] = [None] * len(prompts)
    for name in [None, *ADAPTERS]:
        mine = [i for i, a in enumerate(assigned) if a == name]
        outs = reference(
            folder, None if name is None else adapters[name], [prompts[i] for i in mine]
        )
        for i, out in zip(mine, outs, strict=True):
            expected[i] = out
    # The adapters matter: on the base model most of their prompts would go otherwise.
    with_adapter = [i for i, a in enumerate(assigned) if a is not None]
    base = reference(folder, None, [prompts[i] for i in with_adapter])
    changed = sum(expected[i] != out for i, out in zip(with_adapter, base, strict=True))
    assert changed >= 0.75 * len(with_adapter)
    return folder, adapters, prompts, assigned, expected


def lora_engine(folder, adapters, **settings) -> LLMEngine:
    config = EngineConfig(
        model=str(folder), dtype="float32", enable_lora=True, max_loras=3, **settings
    )
    engine = LLMEngine(config)
    for name, path in adapters.items():
        engine.adapters.load(name, str(path))
    return engine


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_mixed_adapters_match_merged_weights(lora_case, regime, request):
    skip_outside_family_regimes(request.node.callspec.params["lora_case"], regime, MODELS)
    folder, adapters, prompts, assigned, expected = lora_case
    settings, must_happen = REGIMES[regime]
    engine = lora_engine(folder, adapters, **settings)
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0)
    for _ in range(2):  # the second pass finds the first's blocks in the prefix cache
        outputs = engine.generate(prompts, params, use_tqdm=False, lora_request=assigned)
        for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
            assert out.token_ids == ref, f"prompt {i} ({len(prompts[i])} tokens, {assigned[i]})"
    assert engine.metrics.max_batch_size > 1
    if must_happen:
        assert engine.metrics.as_dict()[must_happen] > 0
    stats = engine.memory_stats()
    assert stats["prefix_cache_hits"] > 0
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0
