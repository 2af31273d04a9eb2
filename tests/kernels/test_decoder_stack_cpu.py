"""The C++ decoder stack (kernels/decoder_stack_cpu.py) gives the layers' results to
the bit: on the steps it serves (decodes, short chunks), against the same model run
layer by layer, with quantized (int8) and bf16-panel projections, for Llama's layer and
for Qwen3's (q/k norms), Gemma 2's (norms after attention and the MLP, GeGLU, sliding
layers, soft-capped attention scores) and Gemma 3's (q/k norms too, sliding layers with
their own RoPE base), also over an int8 KV cache; and greedy generation through the
engine, whose steps mix prefills (layer by layer) and decodes (the stack), is unchanged."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.models.decoder import DecoderForCausalLM
from hetero_infer.engine.models.layers import Linear
from hetero_infer.kernels import decoder_stack_cpu, paged_attention_cpu
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.decoder_stack_cpu import SHORT_CHUNK
from hetero_infer.kernels.kv_quant import to_cache
from hetero_infer.kernels.linear import unfused
from hetero_infer.kernels.linear_quantized import QuantizedLinear

from tests.engine.test_int8_weights import kernel_sized_llama, random_prompts
from tests.engine.test_longrope import save_phi3_with_short_original
from tests.helpers import make_byte_fallback_tokenizer
from tests.kernels.test_cpu_threads import THREADS, torch_threads
from tests.tiny_models import save_tiny_model

pytestmark = pytest.mark.cpu_kernels("quantized_linear", "linear_packed")

QUANTIZATIONS = ["int8", "none"]  # quantized panels; bf16 panels


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma2", "gemma3", "phi3"])
def model_dir(request, tmp_path_factory) -> Path:
    """Each family's layer. The tiny Qwen3, Gemma 2 and Gemma 3 (tests/tiny_models.py)
    have projections the packed kernels take (outputs a multiple of 32: qkv 192, 256 and
    128, gate_up 192, 192 and 160); the Gemmas' sliding layers (window 8) are passed by
    the steps' contexts, Gemma 3's take a RoPE base of their own, Gemma 2's scores are
    soft-capped. Phi-3's LongRoPE takes its long factors past 64 positions, which the
    steps' contexts pass too."""
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "phi3":
        return save_phi3_with_short_original(folder)
    if request.param != "llama":
        return save_tiny_model(request.param, folder)
    torch.manual_seed(0)
    config = kernel_sized_llama()
    config.tie_word_embeddings = False
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    make_byte_fallback_tokenizer().save_pretrained(folder)
    return folder


def model_type(folder: Path) -> str:
    return json.loads((folder / "config.json").read_text())["model_type"]


def engine_for(folder: Path, quantization: str, kv_cache_dtype: str = "auto") -> LLMEngine:
    config = EngineConfig(
        model=str(folder),
        dtype="bfloat16",
        quantization=quantization,
        max_num_blocks=256,
        kv_cache_dtype=kv_cache_dtype,
    )
    return LLMEngine(config)


def run_both_ways(runner, lengths: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's output on a step of (cached, new) tokens per sequence: through the
    stack, then layer by layer. Random tokens and cached keys/values (not all zeros)."""
    stack = runner.fast_path
    assert stack is not None  # the stack computes every part of the model's layers
    inputs = runner.inputs.synthetic(lengths)
    assert stack.can_run(inputs)
    torch.manual_seed(1)
    inputs.input_ids.copy_(torch.randint(3, 300, inputs.input_ids.shape))
    for cache in (c for layer in runner.kv_caches for c in layer):
        if cache.dtype == torch.int8:  # rows of values and their scales
            noise = torch.randn(*cache.shape[:-1], runner.model.head_dim)
            cache.copy_(to_cache(noise, torch.int8))
        else:
            cache.normal_()
    stacked = stack.run(inputs)
    layered = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta)
    assert stacked.abs().sum() > 0
    return stacked, layered


def quantized_activation_bits(model: DecoderForCausalLM) -> set[int]:
    """The activation widths of the model's projections that run the quantized kernel."""
    linears = [unfused(m.packed) for m in model.modules() if isinstance(m, Linear)]
    return {m.activation_bits for m in linears if isinstance(m, QuantizedLinear)}


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_decode_steps_equal_the_layers_to_the_bit(model_dir, quantization) -> None:
    runner = engine_for(model_dir, quantization).runner
    if quantization == "int8":
        # Gemma 3's projections take 16-bit activations (its family's outlier channels),
        # the others int8: the stack must run each projection at its own width.
        gemma3 = runner.model.config.architecture == "Gemma3ForCausalLM"
        assert quantized_activation_bits(runner.model) == {16 if gemma3 else 8}
    with torch.inference_mode():
        # 3 sequences decoding at different context lengths (after their cached tokens)
        stacked, layered = run_both_ways(runner, [(40, 1), (7, 1), (100, 1)])
    assert torch.equal(stacked, layered)


def test_decode_steps_over_an_int8_cache_equal_the_layers_to_the_bit(model_dir) -> None:
    # The stack stores and attends through the same kernels, which read int8 rows.
    runner = engine_for(model_dir, "none", kv_cache_dtype="int8").runner
    assert runner.kv_caches[0][0].dtype == torch.int8
    with torch.inference_mode():
        stacked, layered = run_both_ways(runner, [(40, 1), (7, 1), (100, 1)])
    assert torch.equal(stacked, layered)


def assert_decodes_equal_the_layers_at_each_thread_count(runner) -> None:
    """A decode step of 4 sequences through the stack and through the layers: the same
    bits, and the same at each of THREADS."""
    results = []
    for threads in THREADS:
        with torch_threads(threads), torch.inference_mode():
            stacked, layered = run_both_ways(runner, [(40, 1), (7, 1), (100, 1), (3, 1)])
        assert torch.equal(stacked, layered), threads
        results.append(stacked)
    assert all(torch.equal(result, results[0]) for result in results[1:])


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_decode_steps_equal_the_layers_at_any_thread_count(model_dir, quantization) -> None:
    """The stack's kernels split their work by torch's thread count as the layers' do:
    the same bits at 1 to 4 threads (restored after)."""
    assert_decodes_equal_the_layers_at_each_thread_count(engine_for(model_dir, quantization).runner)


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_short_chunks_equal_the_layers_on_per_token_attention(
    model_dir, quantization, monkeypatch
) -> None:
    runner = engine_for(model_dir, quantization).runner
    lengths = [(40, 5), (7, 1), (0, SHORT_CHUNK)]  # drafts to verify, a decode, a prompt
    with torch.inference_mode():
        # The layers give bf16 chunks to the tiled kernel, which sums in another order...
        stacked, tiled = run_both_ways(runner, lengths)
        torch.testing.assert_close(stacked, tiled, atol=0.1, rtol=0.05)
        # ...and the stack's results where they run every token as its own row, as it does.
        monkeypatch.setattr(paged_attention_cpu, "tiled_kernel_serves", lambda *args: False)
        stacked, layered = run_both_ways(runner, lengths)
    assert torch.equal(stacked, layered)
    longer = runner.inputs.synthetic([(0, SHORT_CHUNK + 1), (3, 1)])
    assert not runner.fast_path.can_run(longer)  # goes layer by layer


def test_a_step_over_one_kv_group_serves_every_layer(model_dir, monkeypatch) -> None:
    """A step with one KV cache group's tables (a draft model keeps one cache for all of
    its layers) serves the layers of every group, in the stack as in the layers."""
    runner = engine_for(model_dir, "none").runner
    if not any(layer.kv_group for layer in runner.model.decoder_stack_spec().layers):
        pytest.skip("every layer is in the first KV cache group")
    two_groups = runner.inputs.synthetic

    def one_group(lengths):
        inputs = two_groups(lengths)
        assert inputs.meta.later_groups
        inputs.meta = dataclasses.replace(inputs.meta, later_groups=())
        return inputs

    monkeypatch.setattr(runner.inputs, "synthetic", one_group)
    with torch.inference_mode():
        stacked, layered = run_both_ways(runner, [(40, 1), (7, 1)])
    assert torch.equal(stacked, layered)


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_greedy_generation_is_unchanged(model_dir, quantization) -> None:
    prompts = random_prompts(4)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    with_stack = engine_for(model_dir, quantization)
    served = 0
    can_run = with_stack.runner.fast_path.can_run

    def counting(inputs) -> bool:
        nonlocal served
        served += can_run(inputs)
        return can_run(inputs)

    with_stack.runner.fast_path.can_run = counting
    layer_by_layer = engine_for(model_dir, quantization)
    layer_by_layer.runner.fast_path = None
    expected = layer_by_layer.generate(prompts, params, use_tqdm=False)
    got = with_stack.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert served >= 11  # the decode steps


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_fp32_runs_layer_by_layer(model_dir, quantization) -> None:
    """Even with every projection one of our kernels' (int8): fp32 runs the torch
    references of the ops the stack calls in C++."""
    config = EngineConfig(
        model=str(model_dir), dtype="float32", quantization=quantization, max_num_blocks=64
    )
    engine = LLMEngine(config)
    assert engine.runner.fast_path is None


@pytest.mark.parametrize("name", ["qwen3", "gemma2", "gemma3"])
def test_qwen3_and_gemma_layers_are_all_served(name, tmp_path):
    folder = save_tiny_model(name, tmp_path / name)
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", max_num_blocks=64))
    spec = engine.runner.model.decoder_stack_spec()
    assert decoder_stack_cpu.unserved_parts(load_cpu_kernels(), spec) == []
    assert engine.runner.fast_path is not None
    assert decoder_stack_cpu.pack_decoder_stack(None, spec) is None  # kernels not built
    assert spec.attn_logit_softcap == (10.0 if name == "gemma2" else None)
    if name == "gemma3":  # the sliding layers' tables are their own, the global one's not
        ropes = [layer.rope for layer in spec.layers]
        assert ropes[0] is ropes[1] is ropes[3] and ropes[2] is not ropes[0]
        assert not torch.equal(ropes[0][0], ropes[2][0])


def test_layers_the_stack_does_not_compute_run_one_by_one(tmp_path, caplog, monkeypatch):
    """A part the stack lacks (an activation other than SiLU's and tanh-GELU's) is
    refused, not ignored: every step runs layer by layer, and the log says what the
    stack lacks, each part once."""
    spec_of = DecoderForCausalLM.decoder_stack_spec

    def with_other_activations(model: DecoderForCausalLM):
        spec = spec_of(model)
        layers = [
            dataclasses.replace(layer, activation=activation)
            for layer, activation in zip(spec.layers, ["relu", "gelu", "relu"], strict=False)
        ]
        return dataclasses.replace(spec, layers=(*layers, *spec.layers[3:]))

    monkeypatch.setattr(DecoderForCausalLM, "decoder_stack_spec", with_other_activations)
    folder = save_tiny_model("gemma3", tmp_path / "gemma3")
    with caplog.at_level(logging.INFO, logger=decoder_stack_cpu.__name__):
        engine = LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", max_num_blocks=64))
    spec = engine.runner.model.decoder_stack_spec()
    expected = ["the gelu activation", "the relu activation"]
    assert decoder_stack_cpu.unserved_parts(load_cpu_kernels(), spec) == expected
    assert engine.runner.fast_path is None
    assert f"does not run {', '.join(expected)}" in caplog.text
    out = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0.0))
    assert len(out[0].token_ids) == 4
