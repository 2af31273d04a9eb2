"""LoRA adapters loaded, refused and unloaded at run time on the engine: what cannot be
served is refused with a message naming the problem and changes nothing; the prefix
cache keeps each adapter's KV to itself; an adapter unloaded while requests use it
lets them finish, and frees its slot and their blocks after."""

from __future__ import annotations

import shutil

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.lora import LoRANotFoundError, LoRARequest
from hetero_infer.engine.settings.exceptions import ValidationError

from tests.engine.test_exactness import EOS
from tests.lora_adapters import edit_adapter_config, merged_model, save_adapter
from tests.reference import transformers_greedy
from tests.tiny_models import save_tiny_model

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    folder = save_tiny_model("llama", root / "model")
    a = save_adapter(folder, root / "a", seed=1)
    b = save_adapter(folder, root / "b", seed=2)
    other = save_tiny_model("qwen2", root / "other")
    return root, folder, a, b, save_adapter(other, root / "for-other", seed=3)


def make_engine(folder, **settings) -> LLMEngine:
    config = dict(model=str(folder), dtype="float32", enable_lora=True, max_loras=2)
    return LLMEngine(EngineConfig(**{**config, **settings}))


def greedy(engine, prompts, lora):
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    return [
        o.token_ids for o in engine.generate(prompts, params, use_tqdm=False, lora_request=lora)
    ]


def expected(folder, adapter, prompts):
    model = merged_model(folder, adapter)
    return transformers_greedy(model, prompts, MAX_TOKENS, eos_token_id=EOS, pad_token_id=0)


def test_refused_adapters_name_the_problem_and_change_nothing(case, tmp_path):
    root, folder, a, _, for_other = case
    engine = make_engine(folder, max_lora_rank=8)
    engine.adapters.load("a", str(a))
    missing = shutil.copytree(a, tmp_path / "missing")
    (missing / "adapter_model.safetensors").unlink()
    high = save_adapter(folder, tmp_path / "high", seed=4, rank=16)
    dora = shutil.copytree(a, tmp_path / "dora")
    edit_adapter_config(dora, use_dora=True)
    refusals = {
        "missing": (str(missing), "adapter_model.safetensors is missing"),
        "nowhere": (str(tmp_path / "nowhere"), "adapter_config.json is missing"),
        "high": (str(high), "rank 16, above max_lora_rank (8)"),
        "other": (str(for_other), "does not fit this model"),
        "dora": (str(dora), "use_dora=True is not supported"),
        "a": (str(a), "'a' is already loaded"),
    }
    for name, (path, message) in refusals.items():
        with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
            engine.adapters.load(name, path)
    assert [adapter.name for adapter in engine.adapters.loaded()] == ["a"]
    assert set(engine.lora.registry.slots) == {1}  # no slot taken by a refusal
    with pytest.raises(LoRANotFoundError, match="'nope' is not loaded"):
        engine.add_request([5, 6, 7], lora_request="nope")
    with pytest.raises(LoRANotFoundError, match="'nope' is not loaded"):
        engine.adapters.unload("nope")
    assert not engine.has_pending_work()
    disabled = LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    with pytest.raises(ValidationError, match="not enabled"):
        disabled.adapters.load("a", str(a))


def test_max_loras_slots(case):
    _, folder, a, b, _ = case
    engine = make_engine(folder, max_loras=1)
    engine.adapters.load("a", str(a))
    with pytest.raises(ValidationError, match=r"all 1 LoRA slots \(max_loras\) are in use: unl"):
        engine.adapters.load("b", str(b))  # none is unloaded and still finishing requests
    engine.adapters.unload("a")
    engine.adapters.load("b", str(b))  # the slot is free again
    assert [adapter.name for adapter in engine.adapters.loaded()] == ["b"]


def test_prefix_cache_is_keyed_by_adapter(case):
    _, folder, a, b, _ = case
    engine = make_engine(folder)
    engine.adapters.load("a", str(a))
    engine.adapters.load("b", str(b))
    prompt = list(range(3, 70))  # 4 full blocks
    hits = lambda: engine.memory_stats()["prefix_cache_hits"]  # noqa: E731
    assert greedy(engine, [prompt], "a") == expected(folder, a, [prompt])
    assert greedy(engine, [prompt], "b") == expected(folder, b, [prompt])
    assert greedy(engine, [prompt], None) == expected(folder, None, [prompt])
    assert hits() == 0  # the same tokens, three adapters: three sets of KV
    assert greedy(engine, [prompt], "a") == expected(folder, a, [prompt])
    assert hits() == 64  # its own blocks, found again


def test_block_hashes_are_salted_by_adapter():
    manager = BlockManager(8, 4)
    tokens = list(range(8))
    plain = Sequence("p", tokens, SamplingParams())
    adapter_a, adapter_b = LoRARequest("a", 1, 2**40, "a"), LoRARequest("b", 2, 2**41, "b")
    first = Sequence("a", tokens, SamplingParams(), lora=adapter_a)
    second = Sequence("b", tokens, SamplingParams(), lora=adapter_b)
    hashes = [manager.block_hashes(seq, 2) for seq in (plain, first, second)]
    assert len({h[0] for h in hashes}) == 3 and len({h[1] for h in hashes}) == 3
    first.long_rope = True  # LongRoPE salts the adapter's hashes further
    unrotated = Sequence("c", tokens, SamplingParams(), lora=adapter_a)
    assert first.hash_salt != unrotated.hash_salt


def test_unloading_while_requests_use_it(case):
    _, folder, a, b, _ = case
    engine = make_engine(folder)
    engine.adapters.load("a", str(a))
    prompts = [[5 + i, 9, 11, 40 + i] for i in range(4)]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    ids = [engine.add_request(p, params, lora_request="a") for p in prompts]
    named = engine.lora.resolve("a")  # a request named before the unload, queued after
    for _ in range(3):
        engine.step()
    engine.adapters.unload("a")
    assert engine.adapters.loaded() == []
    with pytest.raises(LoRANotFoundError, match="not loaded"):
        engine.add_request([5, 6], params, lora_request="a")
    assert engine.lora.registry.slots  # still held: its requests are running
    with pytest.raises(LoRANotFoundError, match="has been unloaded"):
        engine.add_request([5, 6], params, lora_request=named)
    while engine.has_pending_work():
        engine.step()
    outputs = [engine.get_output(i).token_ids for i in ids]
    assert outputs == expected(folder, a, prompts)  # they finished on the adapter
    assert not engine.lora.registry.slots and not engine.runner.lora.slot_weights(1)
    stats = engine.memory_stats()
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0
    with pytest.raises(LoRANotFoundError, match="has been unloaded"):
        engine.add_request([5, 6], params, lora_request=named)  # its slot is empty
    engine.adapters.load("b", str(b))  # another adapter in the freed slot
    with pytest.raises(LoRANotFoundError, match="has been unloaded"):
        engine.add_request([5, 6], params, lora_request=named)
    engine.adapters.unload("b")
    engine.adapters.load("a", str(a))  # loads again, into the freed slot
    assert greedy(engine, prompts, "a") == outputs
