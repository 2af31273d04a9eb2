"""Weight-only int8: compressed-tensors checkpoints (both stored formats) and float
checkpoints quantized at load (``quantization int8``), on a tiny Llama whose sizes the
CPU kernel takes.

In fp32 ("auto") the int8 weights are dequantized, and greedy output equals
transformers' on the same dequantized weights token for token; in bf16 (or when
asked by name) they stay int8 for the quantized kernel, whose teacher-forced choices
must agree with the fp32 model's almost everywhere.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.loader import ModelSource, load_state_dict
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.engine.worker.model_loader import keeps_quantized
from hetero_infer.kernels.linear_quantized import QuantizedLinear
from hetero_infer.kernels.quantized import INT8, QuantizedWeight

from tests.helpers import BYTE_FALLBACK_VOCAB_SIZE
from tests.int8_checkpoints import quantization_config, save_int8_checkpoint
from tests.reference import transformers_greedy

EOS = 2
MAX_NEW_TOKENS = 16

needs_kernel = pytest.mark.cpu_kernels("quantized_linear")


def kernel_sized_llama() -> transformers.LlamaConfig:
    """Inputs a multiple of 32 and outputs of 16: every linear layer fits the kernel."""
    return transformers.LlamaConfig(
        vocab_size=BYTE_FALLBACK_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.5,  # peaked logits: greedy choices far from ties
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
        tie_word_embeddings=True,
    )


def random_prompts(count: int = 8) -> list[list[int]]:
    rng = random.Random(3)
    return [
        [rng.randrange(3, BYTE_FALLBACK_VOCAB_SIZE) for _ in range(n)]
        for n in range(5, 5 + 9 * count, 9)
    ]


@pytest.fixture(scope="module", params=["int-quantized", "pack-quantized"])
def checkpoint(request, tmp_path_factory) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """(int8 checkpoint, fp32 checkpoint of its dequantized weights, int8 values)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(kernel_sized_llama(), dtype=torch.float32)
    folder = tmp_path_factory.mktemp("int8")
    reference = tmp_path_factory.mktemp("dequantized")
    return folder, reference, save_int8_checkpoint(model, folder, reference, request.param)


def engine_for(folder: Path, **settings) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), max_num_blocks=256, **settings))


def linear_layers(engine: LLMEngine) -> list:
    model = engine.runner.model
    return [layer.self_attn.qkv_proj for layer in model.layers] + [
        layer.mlp.down_proj for layer in model.layers
    ]


def teacher_forced_top1(engine: LLMEngine, prompts: list[list[int]]) -> list[int]:
    sampling = SamplingParams(max_tokens=1, prompt_logprobs=1)
    tops = []
    for out in engine.generate(prompts, sampling, use_tqdm=False):
        tops += [max(lp, key=lp.get) for lp in out.prompt_logprobs[1:]]
    return tops


def agreement(a: list[int], b: list[int]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def test_the_stored_values_load_as_they_are(checkpoint) -> None:
    folder, reference, values = checkpoint
    kept = load_state_dict(ModelSource(folder), torch.bfloat16, keep_quantized=True)
    dequantized = load_state_dict(ModelSource(folder), torch.float32)
    expected = load_state_dict(ModelSource(reference), torch.float32)
    assert not any(name.endswith(("_scale", "_packed", "_shape")) for name in kept)
    for name, int8_values in values.items():
        weight = kept[name]
        assert isinstance(weight, QuantizedWeight) and weight.qtype == INT8
        assert torch.equal(weight.data, int8_values)
        assert weight.scales.dtype == torch.float32
        assert torch.equal(dequantized[name], expected[name])
    assert kept["model.embed_tokens.weight"].dtype == torch.bfloat16  # not in the scheme


def test_fp32_greedy_matches_transformers_on_the_dequantized_weights(checkpoint) -> None:
    folder, reference, _ = checkpoint
    prompts = random_prompts()
    model = transformers.AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32)
    expected = transformers_greedy(
        model.eval(), prompts, MAX_NEW_TOKENS, eos_token_id=EOS, pad_token_id=0
    )
    engine = engine_for(folder, dtype="float32")
    assert not any(isinstance(m.packed, QuantizedLinear) for m in linear_layers(engine))
    outputs = engine.generate(
        prompts, SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0), use_tqdm=False
    )
    assert [o.token_ids for o in outputs] == expected


@needs_kernel
@pytest.mark.parametrize(
    "settings", [dict(dtype="bfloat16"), dict(dtype="float32", quantization="compressed-tensors")]
)
def test_kept_int8_runs_the_kernel_and_agrees_with_fp32(checkpoint, settings) -> None:
    folder, reference, _ = checkpoint
    prompts = random_prompts()
    expected = teacher_forced_top1(engine_for(reference, dtype="float32"), prompts)
    engine = engine_for(folder, **settings)
    layers = linear_layers(engine)
    assert all(isinstance(m.packed, QuantizedLinear) and m.packed.qtype == INT8 for m in layers)
    assert all(m.weight.numel() == 0 for m in layers)  # no dequantized copy kept
    # Measured 0.86 in bf16 and 0.88 in fp32, where the same weights dequantized to
    # bf16 agree 0.94: this random model's choices are close enough for the kernel's
    # int8 activations (a step of a block's amax / 127) to flip some; SmolLM2 agrees
    # 99% (test_quantized_smollm2.py). A wrong scale or row would agree ~0.
    assert agreement(teacher_forced_top1(engine, prompts), expected) > 0.8


@needs_kernel
def test_quantization_int8_quantizes_a_float_checkpoint_at_load(checkpoint) -> None:
    _, reference, _ = checkpoint
    prompts = random_prompts()
    expected = teacher_forced_top1(engine_for(reference, dtype="float32"), prompts)
    engine = engine_for(reference, dtype="float32", quantization="int8")
    assert all(
        isinstance(m.packed, QuantizedLinear) and m.packed.qtype == INT8
        for m in linear_layers(engine)
    )
    assert agreement(teacher_forced_top1(engine, prompts), expected) > 0.8


def test_quantization_must_fit_the_checkpoint(checkpoint, tmp_path: Path) -> None:
    folder, reference, _ = checkpoint
    gguf = ModelSource(tmp_path / "model.gguf", gguf_file="model.gguf")
    float32 = torch.float32
    assert keeps_quantized(ModelSource(folder), "compressed-tensors", float32)
    assert not keeps_quantized(ModelSource(folder), "auto", float32)
    assert keeps_quantized(ModelSource(folder), "auto", torch.bfloat16)
    assert not keeps_quantized(ModelSource(folder), "none", torch.bfloat16)
    assert keeps_quantized(ModelSource(reference), "int8", float32)
    with pytest.raises(ConfigError, match="'compressed-tensors' does not match .* not quantized"):
        keeps_quantized(ModelSource(reference), "compressed-tensors", float32)
    with pytest.raises(
        ConfigError, match="'gguf' does not match .* quantized by compressed-tensors"
    ):
        keeps_quantized(ModelSource(folder), "gguf", float32)
    with pytest.raises(
        ConfigError, match="'compressed-tensors' does not match .* quantized by gguf"
    ):
        keeps_quantized(gguf, "compressed-tensors", float32)
    with pytest.raises(ConfigError, match="a GGUF file keeps its own blocks"):
        keeps_quantized(gguf, "int8", float32)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(quant_method="awq"), "quantization method 'awq' .* is not supported"),
        (dict(format="float-quantized"), "format 'float-quantized' is not supported"),
        ({"weights": {"num_bits": 4}}, "scheme 'group_0' is not supported"),
        ({"weights": {"symmetric": False}}, "scheme 'group_0' is not supported"),
        (
            {"weights": {"strategy": "group", "group_size": 128}},
            "scheme 'group_0' is not supported",
        ),
        (
            {"input_activations": {"num_bits": 8, "type": "int", "dynamic": True}},
            "input activation",
        ),
    ],
)
def test_unsupported_schemes_are_refused_by_name(
    tmp_path: Path, change: dict, message: str
) -> None:
    import json

    config = quantization_config("int-quantized")
    group = config["config_groups"]["group_0"]
    for key, value in change.items():
        if key == "weights":
            group["weights"] = {**group["weights"], **value}
        elif key == "input_activations":
            group[key] = value
        else:
            config[key] = value
    transformers.AutoModelForCausalLM.from_config(kernel_sized_llama()).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "quantization_config": config}))
    with pytest.raises(ConfigError, match=message):
        load_state_dict(ModelSource(tmp_path), torch.float32)
