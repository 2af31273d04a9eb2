"""Greedy output equals transformers' generate, token for token, in fp32, when the
priority policy preempts requests for higher-priority ones: for a max_num_seqs slot
(running requests are taken out of a step they were already scheduled in) and for
KV blocks. A preempted request recomputes its KV and goes on as if it had never left.
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.reference import transformers_greedy
from tests.tiny_models import save_tiny_model

MAX_NEW_TOKENS = 16
LOW, HIGH = 5, 0
PROMPT_LENGTHS = [5, 17, 30, 41, 8, 23, 50, 12]  # the first four low, the rest high


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """(model folder, prompts, transformers' greedy outputs)."""
    folder = save_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in PROMPT_LENGTHS]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    expected = transformers_greedy(
        model.eval(), prompts, MAX_NEW_TOKENS, eos_token_id=2, pad_token_id=0
    )
    return folder, prompts, expected


# Engine settings: a slot short (3 running at most, blocks to spare) or blocks short.
REGIMES = {
    "slots": dict(max_num_seqs=3, block_size=8, max_num_blocks=64, max_model_len=128),
    "blocks": dict(max_num_seqs=8, block_size=8, max_num_blocks=12, max_model_len=96),
}


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_greedy_output_survives_priority_preemption(tiny_llama, regime):
    folder, prompts, expected = tiny_llama
    config = EngineConfig(
        model=str(folder), dtype="float32", scheduling_policy="priority", **REGIMES[regime]
    )
    engine = LLMEngine(config)
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0)
    ids = [engine.add_request(p, params, priority=LOW) for p in prompts[:4]]
    for _ in range(3):  # the low ones are decoding when the high ones arrive
        engine.step()
    ids += [engine.add_request(p, params, priority=HIGH) for p in prompts[4:]]
    while engine.has_pending_work():
        engine.step()
    outputs = [engine.get_output(request_id) for request_id in ids]
    for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
        assert out is not None and out.token_ids == ref, f"prompt {i} differs"
    preemptions = [out.metrics.num_preemptions for out in outputs]
    if regime == "slots":
        # The three low ones running gave way to high ones, the newest first; the
        # fourth low one was still waiting; no high one was ever preempted.
        assert preemptions == [1, 1, 1, 0, 0, 0, 0, 0]
    else:
        assert sum(preemptions[:4]) > 0
    stats = engine.memory_stats()
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0
