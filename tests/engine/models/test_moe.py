"""The mixture-of-experts families' settings, weights and refusals (greedy exactness on
every scheduling regime is tests/engine/test_exactness.py's)."""

from __future__ import annotations

import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.models import ModelConfig
from hetero_infer.engine.models.moe_weights import gather_experts
from hetero_infer.engine.models.sharding import check_divisible
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import QuantizedWeight

from tests.engine.test_exactness import random_prompts, reference_outputs
from tests.helpers import make_byte_fallback_tokenizer
from tests.tiny_models import MOE_MODELS, TINY_MODELS, save_tiny_model


def model_config(name: str) -> ModelConfig:
    return ModelConfig.from_hf(TINY_MODELS[name]())


@pytest.mark.parametrize(
    ("name", "sparse", "renormalize", "shared", "width"),
    [
        ("mixtral", (True, True, True), True, 0, 64),
        ("qwen2_moe", (True, False, True), False, 96, 32),
        ("qwen3_moe", (False, True, False, True), True, 0, 64),
        ("olmoe", (True, True, True), False, 0, 64),
    ],
)
def test_each_family_routes_as_its_config_says(name, sparse, renormalize, shared, width):
    moe = model_config(name).moe
    assert moe.sparse_layers == sparse
    assert moe.renormalize is renormalize
    assert moe.shared_expert_intermediate_size == shared
    assert moe.expert_intermediate_size == width


def test_dense_families_have_no_experts():
    assert model_config("llama").moe is None


def test_olmoe_norms_q_and_k_across_heads():
    config = model_config("olmoe")
    assert config.qk_norm and config.qk_norm_across_heads
    assert not model_config("qwen3_moe").qk_norm_across_heads


def test_qwen2_moe_has_biases_on_qkv_only():
    config = model_config("qwen2_moe")
    assert config.qkv_bias and not config.o_bias


@pytest.mark.parametrize("name", MOE_MODELS)
def test_tensor_parallelism_is_refused_with_the_reason(name):
    with pytest.raises(ConfigError, match="mixture-of-experts.*tensor_parallel_size 1"):
        check_divisible(model_config(name), 2)
    check_divisible(model_config(name), 1)


def test_tensor_parallelism_is_refused_at_start(tmp_path):
    folder = save_tiny_model("olmoe", tmp_path / "olmoe")
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        LLMEngine(EngineConfig(model=str(folder), dtype="float32", tensor_parallel_size=2))


def test_lora_is_refused_at_start(tmp_path):
    folder = save_tiny_model("olmoe", tmp_path / "olmoe")
    with pytest.raises(ConfigError, match="LoRA adapters on a mixture-of-experts model"):
        LLMEngine(EngineConfig(model=str(folder), dtype="float32", enable_lora=True))


@pytest.mark.parametrize("top_k", [0, 9])
def test_experts_per_token_outside_the_experts_is_refused(top_k):
    config = TINY_MODELS["mixtral"]()  # 8 experts
    config.num_experts_per_tok = top_k
    with pytest.raises(ConfigError, match=rf"num_experts_per_tok \({top_k}\) must be between 1"):
        ModelConfig.from_hf(config)
    config.num_experts_per_tok = {0: 1, 9: 8}[top_k]  # the ends themselves are taken
    assert ModelConfig.from_hf(config).moe.top_k == config.num_experts_per_tok


def test_clip_qkv_is_refused():
    config = TINY_MODELS["olmoe"]()
    config.clip_qkv = 8.0
    with pytest.raises(ConfigError, match="clip_qkv"):
        ModelConfig.from_hf(config)


def test_per_expert_tensors_are_stacked():
    gate = [torch.full((2, 4), float(e)) for e in range(3)]
    up = [torch.full((2, 4), 10.0 + e) for e in range(3)]
    down = [torch.full((4, 2), 20.0 + e) for e in range(3)]
    state = {"layers.0.mlp.gate.weight": torch.zeros(3, 4)}
    for e in range(3):
        state[f"layers.0.mlp.experts.{e}.gate_proj.weight"] = gate[e]
        state[f"layers.0.mlp.experts.{e}.up_proj.weight"] = up[e]
        state[f"layers.0.mlp.experts.{e}.down_proj.weight"] = down[e]
    out = gather_experts(state, torch.float32)
    assert set(out) == {
        "layers.0.mlp.gate.weight",
        "layers.0.mlp.experts.gate_up_proj",
        "layers.0.mlp.experts.down_proj",
    }
    assert out["layers.0.mlp.experts.gate_up_proj"].shape == (3, 4, 4)
    assert torch.equal(out["layers.0.mlp.experts.gate_up_proj"][1], torch.cat([gate[1], up[1]]))
    assert torch.equal(out["layers.0.mlp.experts.down_proj"][2], down[2])


def q8(rows: int, seed: int) -> QuantizedWeight:
    data = torch.randint(
        0, 255, (rows, 34), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )
    data[:, 1] = 0x1C  # a finite fp16 scale
    return QuantizedWeight("Q8_0", data, (rows, 32))


def test_quantized_experts_stay_one_weight_each():
    state = {}
    for e in range(2):
        state[f"l.experts.{e}.gate_proj.weight"] = q8(16, e)
        state[f"l.experts.{e}.up_proj.weight"] = q8(16, 10 + e)
        state[f"l.experts.{e}.down_proj.weight"] = q8(32, 20 + e)
    out = gather_experts(state, torch.float32)
    gate_up = out["l.experts.gate_up_proj"]
    assert isinstance(gate_up, list) and len(gate_up) == 2
    assert gate_up[1].shape == (32, 32)
    assert torch.equal(gate_up[1].data[16:], state["l.experts.1.up_proj.weight"].data)


def test_experts_quantized_in_part_become_one_float_stack():
    # A file may quantize some expert tensors and keep others in float (or mix types):
    # whatever is not quantized alike throughout is dequantized into the float stack.
    state = {
        "l.experts.0.gate_proj.weight": q8(16, 0),
        "l.experts.0.up_proj.weight": torch.randn(16, 32),  # float beside quantized
        "l.experts.0.down_proj.weight": q8(32, 1),
        "l.experts.1.gate_proj.weight": q8(16, 2),
        "l.experts.1.up_proj.weight": q8(16, 3),  # both quantized: joined, then dequantized
        "l.experts.1.down_proj.weight": torch.randn(32, 32),
    }
    out = gather_experts(state, torch.float32)

    def dense(name: str) -> torch.Tensor:
        w = state[f"l.experts.{name}.weight"]
        return w.dequantize(torch.float32) if isinstance(w, QuantizedWeight) else w

    gate_up, down = out["l.experts.gate_up_proj"], out["l.experts.down_proj"]
    assert isinstance(gate_up, torch.Tensor) and gate_up.shape == (2, 32, 32)
    for e in range(2):
        expected = torch.cat([dense(f"{e}.gate_proj"), dense(f"{e}.up_proj")])
        assert torch.equal(gate_up[e], expected)
        assert torch.equal(down[e], dense(f"{e}.down_proj"))


def test_a_missing_expert_is_named():
    state = {
        "l.experts.0.gate_proj.weight": torch.zeros(2, 2),
        "l.experts.0.up_proj.weight": torch.zeros(2, 2),
    }
    with pytest.raises(ConfigError, match=r"l\.experts\.0\.down_proj"):
        gather_experts(state, torch.float32)


def test_a_checkpoint_saved_with_stacked_experts_loads(tmp_path):
    """transformers 5 can save the experts stacked (save_original_format=False)."""
    torch.manual_seed(0)
    config = TINY_MODELS["qwen3_moe"]()
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder = tmp_path / "stacked"
    model.save_pretrained(folder, save_original_format=False)
    make_byte_fallback_tokenizer().save_pretrained(folder)
    prompts = random_prompts(5, config.vocab_size)[::4]
    expected = reference_outputs(folder, prompts)
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    outputs = engine.generate(
        prompts, SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False
    )
    assert [out.token_ids for out in outputs] == expected
