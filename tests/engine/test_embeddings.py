"""Embedding requests in the engine: the pooled final hidden state equals transformers'
on the same tiny model in fp32, whether the prompt is prefilled whole or in chunks,
found in the prefix cache or not, recomputed after a preemption, or batched with
generation; the request ends with its prefill and leaves no KV block behind."""

from __future__ import annotations

import random

import pytest
import torch
import transformers
from hetero_infer.engine.core.step_data import ScheduledSequence
from hetero_infer.engine.entrypoints.llm_engine import LLMEngine
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.params.pooling_params import PoolingParams
from hetero_infer.engine.params.sampling_params import SamplingParams
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.worker.pooler import Pooler

from tests.reference import transformers_embedding, transformers_greedy
from tests.tiny_models import save_tiny_model

# Around block (16) and chunk boundaries.
PROMPT_LENGTHS = [1, 2, 15, 16, 17, 40, 100]
# fp32 on both sides; the kernels sum in another order than transformers.
ATOL = 2e-5
# Tokens each generation runs to, eos or not (min_tokens masks eos, as transformers'
# min_new_tokens does).
GENERATED = 100


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def generations(model_dir) -> tuple[list[list[int]], list[list[int]]]:
    """Generation prompts and transformers' greedy continuations of them."""
    generation_prompts = prompts(2, [40, 40, 40])
    causal_lm = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    expected = transformers_greedy(
        causal_lm.eval(), generation_prompts, GENERATED, min_new_tokens=GENERATED
    )
    return generation_prompts, expected


def prompts(seed: int, lengths: list[int] = PROMPT_LENGTHS) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 384) for _ in range(n)] for n in lengths]


def engine_for(model_dir, pooling: str, **settings) -> LLMEngine:
    settings.setdefault("max_num_blocks", 256)  # not the default 2 GiB of KV cache
    return LLMEngine(
        EngineConfig(model=str(model_dir), dtype="float32", pooling=pooling, **settings)
    )


def add_embeddings(engine: LLMEngine, token_lists: list[list[int]], tag: str) -> list[str]:
    processor = engine.input_processor
    ids = [f"{tag}-{i}" for i in range(len(token_lists))]
    for request_id, tokens in zip(ids, token_lists, strict=True):
        engine.add_processed(processor.embedding_request(request_id, processor.tokenize(tokens)))
    return ids


def run(engine: LLMEngine) -> dict[str, RequestOutput]:
    """Step until idle; each request's finished output."""
    finished = {}
    while engine.has_pending_work():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    return finished


def check(
    outputs: list[RequestOutput], hf_model, token_lists, pooling: str, normalize: bool = True
) -> None:
    for out, tokens in zip(outputs, token_lists, strict=True):
        assert out.finish_reason == "stop" and out.token_ids == []
        expected = transformers_embedding(hf_model, tokens, pooling, normalize)
        got = torch.tensor(out.embedding)
        assert got.shape == expected.shape
        assert torch.allclose(got, expected, atol=ATOL), (len(tokens), (got - expected).abs().max())


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("budget", [4096, 16], ids=["whole", "chunked"])
def test_matches_transformers(model_dir, hf_model, pooling, budget):
    engine = engine_for(model_dir, pooling, max_num_batched_tokens=budget)
    token_lists = prompts(1)
    for tag in ("cold", "warm"):  # the second pass meets the first's blocks in the cache
        hits_before = engine.block_manager.prefix_hits
        ids = add_embeddings(engine, token_lists, tag)
        finished = run(engine)
        check([finished[i] for i in ids], hf_model, token_lists, pooling)
        assert engine.block_manager.num_used_blocks == 0
    hits = engine.block_manager.prefix_hits - hits_before
    # Last pooling needs only the last token computed; mean pooling every position.
    assert hits > 0 if pooling == "last" else hits == 0


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_beside_generation_and_preemption(model_dir, hf_model, generations, pooling):
    """Embeddings join running generations in a KV cache too small for all of them: the
    long one, newest and prefilled in chunks, is preempted mid-prefill and recomputed
    (for "last" partly from the prefix cache), and every result stays exact."""
    engine = engine_for(
        model_dir,
        pooling,
        block_size=8,
        max_num_blocks=41,
        max_model_len=328,
        max_num_batched_tokens=32,
    )
    generation_prompts, expected = generations
    params = SamplingParams(max_tokens=GENERATED, min_tokens=GENERATED, temperature=0.0)
    for i, prompt in enumerate(generation_prompts):
        engine.add_request(prompt, params, request_id=f"gen-{i}")
    finished = {}
    for _ in range(3):  # the generations are decoding by now
        finished.update({out.request_id: out for out in engine.step() if out.finished})
    token_lists = prompts(3, [200, 7])
    ids = add_embeddings(engine, token_lists, "emb")
    finished.update(run(engine))
    assert finished["emb-0"].metrics.num_preemptions > 0
    assert engine.metrics.max_batch_size > 1
    check([finished[i] for i in ids], hf_model, token_lists, pooling)
    for i, tokens in enumerate(expected):
        assert finished[f"gen-{i}"].token_ids == tokens
    assert engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_a_request_may_leave_its_vector_unnormalized(model_dir, hf_model, pooling):
    """normalize=False gives the pooled hidden state as it is, beside requests for unit
    vectors of the same prompts in the same steps: each request's own choice holds."""
    engine = engine_for(model_dir, pooling, max_num_batched_tokens=16)
    processor = engine.input_processor
    token_lists = prompts(4, [5, 40])
    for i, tokens in enumerate(token_lists):
        for normalize in (False, True):
            prompt = processor.tokenize(tokens)
            engine.add_processed(processor.embedding_request(f"{normalize}-{i}", prompt, normalize))
    finished = run(engine)
    for normalize in (False, True):
        ids = [f"{normalize}-{i}" for i in range(len(token_lists))]
        check([finished[i] for i in ids], hf_model, token_lists, pooling, normalize)
    raw = torch.tensor(finished["False-0"].embedding)
    assert abs(raw.norm().item() - 1) > 0.1  # not a unit vector by chance
    assert engine.block_manager.num_used_blocks == 0


def test_embedding_request_fills_the_context(model_dir):
    engine = engine_for(model_dir, "last", max_model_len=64)
    processor = engine.input_processor
    processor.embedding_request("fits", processor.tokenize([5] * 64))  # no room kept for output
    with pytest.raises(ValueError, match="maximum context length is 64") as error:
        processor.embedding_request("too-long", processor.tokenize([5] * 65))
    assert error.value.param == "input"


def scheduled(request_id: str, start: int, num_new: int, ends: bool) -> ScheduledSequence:
    return ScheduledSequence(
        request_id=request_id,
        token_ids=[0] * num_new,
        start=start,
        block_tables=[[]],
        samples=False,
        sampling_params=SamplingParams(),
        pooling=PoolingParams("mean"),
        returns_embedding=ends,
    )


def test_mean_pooling_counts_a_recomputed_position_once():
    """A prompt preempted mid-prefill comes again from position 0: the positions the sum
    already has are not added twice (their hidden states are the same)."""
    hidden = torch.randn(10, 6)  # the prompt's final hidden states
    pooler = Pooler()
    assert pooler([scheduled("r", 0, 4, False)], hidden[0:4]) == {}
    assert pooler([scheduled("r", 4, 3, False)], hidden[4:7]) == {}
    # Preempted (recompute): positions 0..6 again, then the rest.
    assert pooler([scheduled("r", 0, 5, False)], hidden[0:5]) == {}
    pooled = pooler([scheduled("r", 5, 5, True)], hidden[5:10])
    expected = torch.nn.functional.normalize(hidden.mean(dim=0), dim=0)
    assert torch.allclose(torch.tensor(pooled["r"]), expected, atol=1e-6)
    assert pooler._sums == {}


def test_pooler_forgets_an_aborted_request():
    pooler = Pooler()
    pooler([scheduled("r", 0, 4, False)], torch.randn(4, 6))
    pooler.forget(["r"])
    assert pooler._sums == {}
