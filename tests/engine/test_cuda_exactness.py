"""Greedy fp32 output on an NVIDIA GPU equals transformers', token for token: each family
the engine loads (Llama, Qwen3's q/k norms, Gemma 3's sliding layers, Phi-3's partial
RoPE, and the mixtures of experts on the grouped GEMM), plainly, with chunked prefill
and with async scheduling, and LoRA adapters mixed in one batch against PEFT's merged weights.

test_exactness.py and test_lora_exactness.py check the same on the CPU; here the engine
runs the compiled Triton kernels (TRITON_INTERPRET=0, as ``make gpu-check`` runs the
tests marked cuda) with CUDA graphs for its decodes.
"""

from __future__ import annotations

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.engine.test_exactness import (
    EOS,
    MAX_NEW_TOKENS,
    random_prompts,
    reference_outputs,
    shared_prefix_prompts,
)
from tests.engine.test_lora_exactness import ADAPTERS, reference
from tests.engine.worker.test_cuda_graphs import skip_unless_compiled_triton
from tests.lora_adapters import save_adapter
from tests.tiny_models import TINY_MODELS, save_tiny_model

ARCHITECTURES = ["llama", "qwen3", "gemma3", "phi3", "mixtral", "qwen2_moe", "olmoe"]
REGIMES = {
    "plain": {},
    "chunked": {"max_num_batched_tokens": 40},
    "async": {"async_scheduling": True},  # off by default: the runner on a thread
}
PARAMS = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0)
# Room for the 20 prompts at once (a pool of its own size, not a share of the GPU's
# memory, which other tests' processes hold too), decode graphs at 1 to 32 sequences.
POOL = dict(max_num_seqs=32, max_num_blocks=512, max_model_len=1024)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def tiny(request, tmp_path_factory):
    """(model folder, prompts, transformers' outputs on the CPU)."""
    skip_unless_compiled_triton()
    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    vocab = TINY_MODELS[request.param]().vocab_size
    prompts = random_prompts(1, vocab) + shared_prefix_prompts(2, vocab)[:4]
    return folder, prompts, reference_outputs(folder, prompts)


def assert_matches(engine: LLMEngine, prompts, expected, requests=None) -> None:
    """Two passes (the second hits the prefix cache), then no block held."""
    for _ in range(2):
        outputs = engine.generate(prompts, PARAMS, use_tqdm=False, lora_request=requests)
        for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
            assert out.token_ids == ref, f"prompt {i} ({len(prompts[i])} tokens) differs"
            assert out.finish_reason == ("stop" if ref[-1] == EOS else "length")
    stats = engine.memory_stats()
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0


@pytest.mark.cuda
@pytest.mark.parametrize("regime", REGIMES)
def test_greedy_on_cuda_matches_transformers(tiny, regime):
    folder, prompts, expected = tiny
    settings = dict(dtype="float32", device="cuda", **POOL, **REGIMES[regime])
    config = EngineConfig(model=str(folder), **settings)
    assert_matches(LLMEngine(config), prompts, expected)


@pytest.mark.cuda
def test_lora_on_cuda_matches_merged_weights(tmp_path):
    """Gemma 3 with three adapters and the base model's rows in one batch."""
    skip_unless_compiled_triton()
    folder = save_tiny_model("gemma3", tmp_path / "model")
    adapters = {name: save_adapter(folder, tmp_path / name, **kw) for name, kw in ADAPTERS.items()}
    prompts = random_prompts(3, TINY_MODELS["gemma3"]().vocab_size)
    names = [[*ADAPTERS, None][i % 4] for i in range(len(prompts))]
    pairs = zip(names, prompts, strict=True)
    expected = [reference(folder, adapters.get(name), [p])[0] for name, p in pairs]
    config = EngineConfig(
        model=str(folder),
        dtype="float32",
        device="cuda",
        enable_lora=True,
        max_loras=3,
        **POOL,
    )
    engine = LLMEngine(config)
    for name, path in adapters.items():
        engine.adapters.load(name, str(path))
    assert_matches(engine, prompts, expected, requests=names)
