"""The C++ decoder stack on the mixture-of-experts families (tiny random checkpoints of
Mixtral, Qwen2-MoE with its shared expert and a dense layer, Qwen3-MoE, OLMoE with its
q/k norms across heads), with their projections and experts quantized to int8 at load:
every sparse layer runs the C++ expert block, the stack gives the layers' results to
the bit, and greedy generation through the engine is the same with it and without.
Float experts (no quantization) leave the model layer by layer, saying why."""

from __future__ import annotations

from pathlib import Path

import pytest
from hetero_infer.engine.models.moe import SparseMoe
from hetero_infer.kernels import decoder_stack_cpu
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.moe_cpu import CpuMoe

from tests.kernels.test_decoder_stack_cpu import (
    assert_decodes_equal_the_layers_at_each_thread_count,
    engine_for,
    model_type,
    random_prompts,
)
from tests.tiny_models import MOE_MODELS, save_tiny_model

pytestmark = pytest.mark.cpu_kernels("quantized_linear", "linear_packed")


@pytest.fixture(scope="module", params=MOE_MODELS)
def model_dir(request, tmp_path_factory) -> Path:
    return save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))


def test_every_sparse_layer_runs_the_expert_kernel(model_dir) -> None:
    model = engine_for(model_dir, "int8").runner.model
    blocks = [m for m in model.modules() if isinstance(m, SparseMoe)]
    assert blocks and all(isinstance(block.fused, CpuMoe) for block in blocks)
    assert decoder_stack_cpu.unserved_parts(load_cpu_kernels(), model.decoder_stack_spec()) == []


def test_decode_steps_equal_the_layers_to_the_bit(model_dir) -> None:
    assert_decodes_equal_the_layers_at_each_thread_count(engine_for(model_dir, "int8").runner)


def test_greedy_generation_is_unchanged(model_dir) -> None:
    from hetero_infer.engine import SamplingParams

    prompts = random_prompts(4)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    layer_by_layer = engine_for(model_dir, "int8")
    layer_by_layer.runner.fast_path = None
    expected = layer_by_layer.generate(prompts, params, use_tqdm=False)
    got = engine_for(model_dir, "int8").generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]


def test_float_experts_run_layer_by_layer(tmp_path) -> None:
    folder = save_tiny_model("olmoe", tmp_path / "olmoe")
    engine = engine_for(folder, "none")
    spec = engine.runner.model.decoder_stack_spec()
    assert decoder_stack_cpu.unserved_parts(load_cpu_kernels(), spec) == [
        "mixture-of-experts layers without the C++ expert kernel"
    ]
    assert engine.runner.fast_path is None


def test_lora_weights_on_an_expert_blocks_mlp_are_refused(model_dir) -> None:
    """An expert block has no gate_up or down projection for LoRA weights to update: the
    stack refuses them there, and takes them on the attention's projections."""
    if model_type(model_dir) != "mixtral":
        pytest.skip("one family's sparse layers cover it")
    stack = engine_for(model_dir, "int8").runner.fast_path.stack
    for projection in (2, 3):
        with pytest.raises(RuntimeError, match="LoRA on the MLP of a mixture-of-experts layer"):
            stack.set_lora(0, projection, 1, None)
    stack.set_lora(0, 1, 1, None)
