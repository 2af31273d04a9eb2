"""LoRA adapters through the C++ decoder stack: a decode step whose rows use two
adapters and none gives the layers' results to the bit (both add the updates with the
same C++ kernel), on bf16 panels and on kept-quantized (int8) base weights, for
Llama's layer and Gemma 3's (GeGLU: the update comes before the activation), and the
same bits at 1 to 4 threads: at one thread the stack runs a projection and its updates
one after the other, at more in one parallel region (``in_one_region``), which the
suite's one-thread workers would never reach otherwise; and the adapters change the
output."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine
from hetero_infer.engine.lora import step_groups

from tests.kernels.test_cpu_threads import THREADS, torch_threads
from tests.kernels.test_decoder_stack_cpu import model_dir, run_both_ways  # noqa: F401
from tests.lora_adapters import save_adapter

pytestmark = pytest.mark.cpu_kernels("quantized_linear", "linear_packed")


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_lora_decode_steps_equal_the_layers_to_the_bit(model_dir, quantization, tmp_path):  # noqa: F811
    model_type = json.loads((model_dir / "config.json").read_text())["model_type"]
    if model_type not in ("llama", "gemma3_text"):
        pytest.skip("Llama's layer and Gemma 3's cover the stack's LoRA paths")
    config = EngineConfig(
        model=str(model_dir),
        dtype="bfloat16",
        quantization=quantization,
        max_num_blocks=256,
        enable_lora=True,
        max_loras=2,
    )
    engine = LLMEngine(config)
    engine.adapters.load("a", str(save_adapter(model_dir, tmp_path / "a", seed=5)))
    attention_only = dict(seed=6, rank=16, modules=["q_proj", "k_proj", "o_proj"])
    engine.adapters.load("b", str(save_adapter(model_dir, tmp_path / "b", **attention_only)))
    runner = engine.runner
    assert runner.fast_path is not None and runner.fast_path.takes_lora
    lengths = [(40, 1), (7, 1), (100, 1), (12, 1)]
    slots = np.array([1, 0, 2, 1])
    real_synthetic = runner.inputs.synthetic

    def with_adapters(lengths):
        inputs = real_synthetic(lengths)
        inputs.lora_groups = step_groups(slots, torch.device("cpu"))
        runner.lora.use(inputs.lora_groups)  # the layers' path reads the step's rows
        return inputs

    results = []
    for threads in THREADS:
        with torch_threads(threads), torch.inference_mode():
            runner.inputs.synthetic = real_synthetic
            runner.lora.use([])
            plain, _ = run_both_ways(runner, lengths)
            runner.inputs.synthetic = with_adapters
            stacked, layered = run_both_ways(runner, lengths)
        assert torch.equal(stacked, layered), threads
        assert torch.equal(stacked[1], plain[1]), threads  # the row on the base model
        for row in (0, 2, 3):
            assert not torch.equal(stacked[row], plain[row]), (threads, row)
        results.append(stacked)
    assert all(torch.equal(result, results[0]) for result in results[1:])
