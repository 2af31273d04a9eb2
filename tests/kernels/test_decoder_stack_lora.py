"""LoRA adapters through the C++ decoder stack: a decode step whose rows use two
adapters and none gives the layers' results to the bit (both add the updates with the
same C++ kernel), on bf16 panels and on kept-quantized (int8) base weights, for
Llama's layer and Gemma 3's (GeGLU: the update comes before the activation), and the
same bits at 1 to 4 threads: at one thread the stack runs a projection and its updates
one after the other, at more in one parallel region (``in_one_region``), which the
suite's one-thread workers would never reach otherwise; and the adapters change the
output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine
from hetero_infer.engine.lora import step_groups

from tests.kernels.test_cpu_threads import THREADS, torch_threads
from tests.kernels.test_decoder_stack_cpu import (  # noqa: F401
    model_dir,
    model_type,
    run_both_ways,
)
from tests.lora_adapters import save_adapter

pytestmark = pytest.mark.cpu_kernels("quantized_linear", "linear_packed")


ATTENTION_ONLY = dict(seed=6, rank=16, modules=["q_proj", "k_proj", "o_proj"])


def lora_engine(folder: Path, quantization: str, max_loras: int) -> LLMEngine:
    config = EngineConfig(
        model=str(folder),
        dtype="bfloat16",
        quantization=quantization,
        max_num_blocks=256,
        enable_lora=True,
        max_loras=max_loras,
    )
    engine = LLMEngine(config)
    assert engine.runner.fast_path is not None and engine.runner.fast_path.takes_lora
    return engine


def run_with_slots(runner, lengths: list[tuple[int, int]], slots: np.ndarray):
    """``run_both_ways`` on a step whose rows use the LoRA ``slots`` (0: none)."""
    real_synthetic = runner.inputs.synthetic

    def with_adapters(lengths):
        inputs = real_synthetic(lengths)
        inputs.lora_groups = step_groups(slots, torch.device("cpu"))
        runner.lora.use(inputs.lora_groups)  # the layers' path reads the step's rows
        return inputs

    runner.inputs.synthetic = with_adapters
    try:
        return run_both_ways(runner, lengths)
    finally:
        runner.inputs.synthetic = real_synthetic
        runner.lora.use([])


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_lora_decode_steps_equal_the_layers_to_the_bit(model_dir, quantization, tmp_path):  # noqa: F811
    if model_type(model_dir) not in ("llama", "gemma3_text"):
        pytest.skip("Llama's layer and Gemma 3's cover the stack's LoRA paths")
    engine = lora_engine(model_dir, quantization, max_loras=2)
    engine.adapters.load("a", str(save_adapter(model_dir, tmp_path / "a", seed=5)))
    engine.adapters.load("b", str(save_adapter(model_dir, tmp_path / "b", **ATTENTION_ONLY)))
    runner = engine.runner
    lengths = [(40, 1), (7, 1), (100, 1), (12, 1)]
    results = []
    for threads in THREADS:
        with torch_threads(threads), torch.inference_mode():
            plain, _ = run_both_ways(runner, lengths)
            stacked, layered = run_with_slots(runner, lengths, np.array([1, 0, 2, 1]))
        assert torch.equal(stacked, layered), threads
        assert torch.equal(stacked[1], plain[1]), threads  # the row on the base model
        for row in (0, 2, 3):
            assert not torch.equal(stacked[row], plain[row]), (threads, row)
        results.append(stacked)
    assert all(torch.equal(result, results[0]) for result in results[1:])


def test_a_freed_slot_keeps_nothing_of_its_last_adapter(model_dir, tmp_path):  # noqa: F811
    """An adapter on every projection unloaded, one on attention alone loaded into the
    slot it freed: the stack adds none of the first one's MLP updates (freeing a slot
    clears it at every projection, not only at those the next adapter sets)."""
    if model_type(model_dir) != "llama":
        pytest.skip("one family's layer covers the slots' bookkeeping")
    engine = lora_engine(model_dir, "none", max_loras=1)
    every = engine.adapters.load("a", str(save_adapter(model_dir, tmp_path / "a", seed=5)))
    engine.adapters.unload("a")  # no request uses it: its slot frees at once
    path = str(save_adapter(model_dir, tmp_path / "b", **ATTENTION_ONLY))
    assert engine.adapters.load("b", path).slot == every.slot
    with torch.inference_mode():
        stacked, layered = run_with_slots(engine.runner, [(40, 1)], np.array([every.slot]))
    assert torch.equal(stacked, layered)


def test_lora_weights_for_no_layer_projection_or_slot_are_refused(model_dir):  # noqa: F811
    """set_lora's indices name a layer, a projection (0-3) and a slot that exist: any
    other is refused, not written past the stack's lists."""
    if model_type(model_dir) != "llama":
        pytest.skip("one family's layer covers the indices")
    engine = lora_engine(model_dir, "none", max_loras=1)
    stack = engine.runner.fast_path.stack
    layers = engine.model_config.num_layers
    refused = [
        ((-1, 0, 1), "no such layer"),
        ((layers, 0, 1), "no such layer"),
        ((0, -1, 1), "projection: 0 qkv"),
        ((0, 4, 1), "projection: 0 qkv"),
        ((0, 0, -1), "a LoRA slot is not negative"),
    ]
    for (layer, projection, slot), message in refused:
        with pytest.raises(RuntimeError, match=message):
            stack.set_lora(layer, projection, slot, None)
    stack.set_lora(layers - 1, 3, 0, None)  # the last layer and projection, the first slot
