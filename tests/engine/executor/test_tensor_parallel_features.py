"""Tensor parallelism with the engine's other features: 2 ranks over gloo on the CPU
give what one process gives, in fp32, with n-gram drafts and with a draft model (the
drafted rows' logits gathered from both ranks; the draft model runs whole on rank 0),
with embeddings (last and mean pooling of the all-reduced hidden states, over prompts
prefilled in chunks), with JSON-schema output (the grammar's mask over a vocabulary
padded to split) and with the priority policy preempting requests for higher ones.

Each feature's engine is started once for both ranks: the embedding, JSON-schema and
priority tests share one engine with the priority policy (its requests all end, so
each test starts from an idle engine)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import jsonschema
import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.params.pooling_params import PoolingParams

from tests.engine.executor.test_tensor_parallel import close_logprobs
from tests.engine.test_json_schema import SMALL
from tests.engine.test_spec_decode import LOOPING_BIAS, SPEC, repeated_span_prompts
from tests.tiny_models import TINY_MODELS, save_perturbed_copy, save_tiny_model

T = TypeVar("T")
# Mistral's 6 heads over 2 KV heads (3 and 1 a rank), with a vocabulary of 385 tokens
# that 2 ranks split only with a padding row (the tokenizer has 384: the JSON-schema
# mask never allows the last id). Not the tiny Qwen2: transformers loads its tokenizer
# as Qwen2's (byte-level, with an extra token), which does not round-trip JSON text.
NAME = "mistral"
VOCAB = 385
MAX_TOKENS = 24
# Blocks of 8 tokens, prompts in chunks of at most 32.
SETTINGS = dict(dtype="float32", block_size=8, max_num_batched_tokens=32)
# 12 blocks of 8: the priority test's 8 requests do not fit at once; 3 run at most.
SHARED = dict(
    SETTINGS,
    scheduling_policy="priority",
    max_num_seqs=3,
    max_num_blocks=12,
    max_model_len=96,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_model(NAME, tmp_path_factory.mktemp(NAME), vocab_size=VOCAB)


def one_and_two_ranks(config: EngineConfig, run: Callable[[LLMEngine], T]) -> tuple[T, T]:
    """``run`` on one process, then on two ranks (shut down after)."""
    expected = run(LLMEngine(config))
    engine = LLMEngine(config.replace(tensor_parallel_size=2))
    try:
        assert engine.workers is not None and len(engine.workers.processes) == 1
        got = run(engine)
    finally:
        engine.shutdown()
    assert engine.workers is None
    return expected, got


def tokens_and_logprobs(outputs: list[RequestOutput]) -> list[tuple[list[int], Any]]:
    return [(out.token_ids, out.logprobs) for out in outputs]


def assert_same_generations(
    got: list[RequestOutput], expected: list[RequestOutput], tolerance: float = 5e-4
) -> None:
    assert len(got) == len(expected)
    for i, (out, ref) in enumerate(zip(got, expected, strict=True)):
        assert out.token_ids == ref.token_ids, f"output {i} differs"
        assert out.finish_reason == ref.finish_reason, i
        # 5 layers and up to 24 tokens on: a little further apart than fp32's steps.
        assert close_logprobs(out.logprobs, ref.logprobs, tolerance), f"output {i}'s logprobs"


def speculative_run(engine: LLMEngine) -> tuple[list[RequestOutput], tuple[int, int]]:
    """Greedy outputs of prompts that repeat themselves, plain and looping (drafts
    accepted and rejected), with logprobs; and the (drafted, accepted) draft counts."""
    prompts = repeated_span_prompts(3, VOCAB)
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logit_bias=bias, logprobs=2)
        for bias in ({}, LOOPING_BIAS)
        for _ in prompts
    ]
    outputs = engine.generate(prompts * 2, params, use_tqdm=False)
    stats = engine.metrics.spec_decode
    assert engine.memory_stats()["used_blocks"] == 0
    return outputs, (stats.num_draft_tokens, stats.num_accepted_tokens)


def test_ngram_drafts(folder: Path):
    config = EngineConfig(model=str(folder), speculative_config=SPEC, **SETTINGS)
    (expected, expected_counts), (got, counts) = one_and_two_ranks(config, speculative_run)
    assert_same_generations(got, expected)
    drafted, accepted = counts
    assert 0 < accepted < drafted, counts  # drafts both accepted and rejected
    assert counts == expected_counts


def test_draft_model(folder: Path, tmp_path: Path):
    draft = save_perturbed_copy(folder, tmp_path / "draft", scale=0.1)
    spec = {"model": str(draft), "num_speculative_tokens": 4}
    config = EngineConfig(model=str(folder), speculative_config=spec, **SETTINGS)
    (expected, expected_counts), (got, counts) = one_and_two_ranks(config, speculative_run)
    assert_same_generations(got, expected)
    drafted, accepted = counts
    assert 0 < accepted < drafted, counts
    assert counts == expected_counts


@pytest.fixture(scope="module")
def shared(folder: Path) -> Iterator[tuple[LLMEngine, LLMEngine]]:
    """(one process, two ranks) with the priority policy, for the tests below."""
    config = EngineConfig(model=str(folder), **SHARED)
    engine = LLMEngine(config.replace(tensor_parallel_size=2))
    try:
        assert engine.workers is not None
        yield LLMEngine(config), engine
    finally:
        engine.shutdown()


def run_until_idle(engine: LLMEngine) -> dict[str, RequestOutput]:
    finished = {}
    while engine.has_pending_work():
        finished.update({out.request_id: out for out in engine.step() if out.finished})
    assert engine.memory_stats()["used_blocks"] == 0
    return finished


def test_embeddings(shared: tuple[LLMEngine, LLMEngine]):
    # Around block (8) and chunk (32) boundaries, each pooled both ways.
    generator = torch.Generator().manual_seed(5)
    lengths = [1, 7, 8, 9, 33, 90]
    prompts = [torch.randint(3, VOCAB - 1, (n,), generator=generator).tolist() for n in lengths]

    def embed(engine: LLMEngine) -> list[torch.Tensor]:
        processor = engine.input_processor
        ids = []
        for pooling in ("last", "mean"):
            for i, tokens in enumerate(prompts):
                request = processor.embedding_request(f"{pooling}-{i}", processor.tokenize(tokens))
                engine.add_processed(dataclasses.replace(request, pooling=PoolingParams(pooling)))
                ids.append(request.request_id)
        finished = run_until_idle(engine)
        return [torch.tensor(finished[i].embedding) for i in ids]

    one, two = shared
    expected, got = embed(one), embed(two)
    for i, (vector, reference) in enumerate(zip(got, expected, strict=True)):
        assert vector.shape == (TINY_MODELS[NAME]().hidden_size,)
        # fp32 either way; the ranks sum their partial products in another order.
        torch.testing.assert_close(vector, reference, atol=2e-5, rtol=0, msg=f"embedding {i}")
    # Last and mean pooling differ: both were asked for, and both given.
    assert not torch.allclose(got[len(lengths) - 1], got[-1], atol=1e-3)


def test_json_schema(shared: tuple[LLMEngine, LLMEngine]):
    params = SamplingParams(max_tokens=80, temperature=0.0, json_schema=SMALL, logprobs=2)
    prompts = ["hello", "the cat", [5, 6, 7, 8, 9, 10]]
    expected, got = (engine.generate(prompts, params, use_tqdm=False) for engine in shared)
    assert_same_generations(got, expected)
    for out in got:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SMALL)


def test_priority_preemption(shared: tuple[LLMEngine, LLMEngine]):
    low, high = 5, 0
    generator = torch.Generator().manual_seed(3)
    lengths = [5, 17, 30, 41, 8, 23, 50, 12]  # the first four low, the rest high
    prompts = [torch.randint(3, VOCAB - 1, (n,), generator=generator).tolist() for n in lengths]
    params = SamplingParams(max_tokens=16, temperature=0.0)

    def run(engine: LLMEngine) -> list[RequestOutput]:
        ids = [engine.add_request(p, params, priority=low) for p in prompts[:4]]
        for _ in range(3):  # the low ones are decoding when the high ones arrive
            engine.step()
        ids += [engine.add_request(p, params, priority=high) for p in prompts[4:]]
        finished = run_until_idle(engine)
        return [finished[i] for i in ids]

    one, two = shared
    expected, got = run(one), run(two)
    assert_same_generations(got, expected)
    preemptions = [out.metrics.num_preemptions for out in got]
    assert preemptions == [out.metrics.num_preemptions for out in expected]
    assert sum(preemptions[:4]) > 0, preemptions  # low ones gave way to high ones
