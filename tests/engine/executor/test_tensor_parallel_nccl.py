"""Tensor parallelism over NCCL: 2 ranks on 2 GPUs (this process on GPU 0, the rank it
starts on GPU 1) give one GPU's greedy fp32 tokens and logprobs, on the tiny Mistral
case test_tensor_parallel.py runs over gloo on the CPU: preemption by swap (each rank's
KV blocks to host memory and back), chunked prefill, prefix-cache hits on a second pass,
choices forked from one prompt, and logprobs gathered from both ranks' vocabularies.

Both engines run eagerly: the ranks replay no CUDA graphs, so the one GPU runs the same
kernels and any difference is the split's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine

from tests.engine.executor.test_tensor_parallel import (
    CHECKPOINTS,
    REGIMES,
    close_logprobs,
    requests,
)
from tests.tiny_models import TINY_MODELS, save_tiny_model

# One case of the CPU test's two: swap is what the GPU does differently (device to host
# and back); each case starts a rank and an NCCL group, the costliest part here.
NAME = "mistral"


@pytest.mark.cuda
def test_two_gpus_give_one_gpu_tokens(tmp_path: Path):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 NVIDIA GPUs; {torch.cuda.device_count()} here")
    folder = save_tiny_model(NAME, tmp_path / NAME, **CHECKPOINTS[NAME])
    prompts, params = requests(TINY_MODELS[NAME]().vocab_size)
    config = EngineConfig(
        model=str(folder), dtype="float32", device="cuda", enforce_eager=True, **REGIMES[NAME]
    )
    reference = LLMEngine(config)
    expected = reference.generate(prompts, params, use_tqdm=False)

    engine = LLMEngine(config.replace(tensor_parallel_size=2))
    try:
        assert engine.workers is not None and len(engine.workers.processes) == 1
        group = engine.runner.sender.tp.device_group
        assert type(group).__name__ == "ProcessGroupNCCL", type(group)
        for number in (1, 2):  # the second pass finds the first's blocks in the prefix cache
            outputs = engine.generate(prompts, params, use_tqdm=False)
            assert len(outputs) == len(expected)
            for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
                assert out.token_ids == ref.token_ids, f"pass {number}, output {i}"
                assert out.finish_reason == ref.finish_reason
                assert close_logprobs(out.logprobs, ref.logprobs), f"output {i}'s logprobs"
                assert close_logprobs(out.prompt_logprobs, ref.prompt_logprobs), i
        stats, memory = engine.metrics.as_dict(), engine.memory_stats()
        assert stats["num_preemptions"] > 0 and memory["swapped_out_blocks"] > 0
        assert memory["prefix_cache_hits"] > 0
        # The logits themselves, gathered from both GPUs' vocabularies: one GPU's, but for
        # the order of fp32 sums cuBLAS picks for half the vocabulary.
        hidden = torch.randn(3, reference.model_config.hidden_size, device="cuda")
        with torch.inference_mode():
            logits = engine.runner.compute_logits(hidden)
            expected_logits = reference.runner.compute_logits(hidden)
        torch.testing.assert_close(logits, expected_logits, rtol=1e-5, atol=1e-4)
    finally:
        engine.shutdown()
    assert engine.workers is None  # rank 1 left on STOP, by itself
