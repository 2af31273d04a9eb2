"""Both seed projects' Python APIs, as their documents write them, on a tiny model.

Hetero-Paged-Infer (Rust) in Python names: ``InferenceEngine(EngineConfig(...))``,
``submit_request(text, GenerationParams(...))``, ``run()``, ``engine.metrics``,
``memory_stats()``, a pluggable tokenizer. mini-infer: ``generate(prompts=[...],
max_tokens=..., temperature=..., top_p=...)``, ``add_request(prompt=..., max_tokens=...,
sampling_params=...)``, ``get_output(id)``, ``GenerateOutput``, and its exceptions.
"""

from __future__ import annotations

import json

import pytest
from hetero_infer.engine import (
    CompletedRequest,
    ConfigError,
    EngineConfig,
    EngineError,
    ExecutionError,
    GenerateOutput,
    GenerationParams,
    InferenceEngine,
    InvalidRequestError,
    LLMEngine,
    ModelNotFoundError,
    OutOfMemoryError,
    SamplingParams,
    SchedulerError,
    ValidationError,
)

from tests.helpers import BYTE_FALLBACK_VOCAB_SIZE
from tests.tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def seed_config(model_dir, **values) -> EngineConfig:
    values = {"max_model_len": 256, "max_num_blocks": 64, **values}
    return EngineConfig(model=str(model_dir), **values)


# ---- Hetero-Paged-Infer's API ----


def test_hetero_readme_example(model_dir):
    engine = InferenceEngine(seed_config(model_dir, max_batch_size=32))
    request_id = engine.submit_request(
        "Hello, world!", GenerationParams(max_tokens=100, temperature=0.8, top_p=0.95)
    )
    results = engine.run()

    assert isinstance(request_id, int)
    (result,) = results
    assert isinstance(result, CompletedRequest)
    assert result.request_id == request_id and result.input_text == "Hello, world!"
    assert result.success and result.error is None
    assert result.finish_reason in ("stop", "length")
    assert 1 <= result.generated_tokens == len(result.output_tokens) <= 100
    assert result.input_tokens > 0 and result.duration > 0
    assert result.output_text == engine._engine.tokenizer.decode(result.output_tokens)
    assert not engine.has_pending_work()
    metrics = engine.metrics
    assert metrics.requests_processed == 1
    assert metrics.tokens_generated == result.generated_tokens
    assert metrics.avg_latency_ms > 0 and metrics.throughput_tok_per_sec > 0
    assert engine.get_metrics() is metrics
    stats = engine.memory_stats()
    assert stats.total_blocks == 64 and stats.used_blocks == 0 and stats.free_blocks == 64
    assert stats.num_sequences == 0 and stats.utilization() == 0.0


def test_hetero_step_loop_and_batch_size(model_dir):
    engine = InferenceEngine(seed_config(model_dir, max_batch_size=2, max_num_seqs=256))
    assert engine.config.max_num_seqs == 2  # the seed's two limits are one here
    greedy = GenerationParams(max_tokens=8, temperature=0.0, top_p=1.0)
    ids = [engine.submit_request(f"prompt {i}", greedy) for i in range(5)]
    assert ids == sorted(set(ids))
    done: list[CompletedRequest] = []
    while engine.has_pending_work():
        done += engine.step()
        assert engine.memory_stats().num_sequences <= 5
    assert sorted(r.request_id for r in done) == ids
    assert engine.metrics.max_batch_size == 2
    # Greedy: the same text as the vLLM-style API gives for the same prompt.
    reference = LLMEngine(seed_config(model_dir))
    expected = reference.generate("prompt 3", SamplingParams(max_tokens=8, temperature=0.0))
    assert next(r for r in done if r.request_id == ids[3]).output_text == expected[0].text


def test_hetero_cancel_frees_blocks(model_dir):
    engine = InferenceEngine(seed_config(model_dir))
    keep = engine.submit_request("keep me", GenerationParams(max_tokens=4))
    drop = engine.submit_request("drop me", GenerationParams(max_tokens=50))
    engine.step()
    assert engine.cancel_request(drop) and not engine.cancel_request(12345)
    results = {r.request_id: r for r in engine.run()}
    assert results[keep].finish_reason in ("stop", "length")
    assert engine.memory_utilization() == 0.0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (GenerationParams(max_tokens=0), "max_tokens"),
        (GenerationParams(temperature=2.5), "temperature"),
        (GenerationParams(temperature=-1.0), "temperature"),
        (GenerationParams(top_p=0.0), "top_p"),
        (GenerationParams(top_p=1.5), "top_p"),
    ],
)
def test_generation_params_validation(params, field):
    assert not params.is_valid()
    with pytest.raises(ValidationError, match=field) as caught:
        params.validate()
    assert isinstance(caught.value, ValueError) and caught.value.param == field
    assert GenerationParams().is_valid() and GenerationParams(temperature=2.0).is_valid()


class CharTokenizer:
    """The seed's TokenizerTrait in Python: a character per token, nothing else."""

    FIRST_ID = 10

    def encode(self, text: str) -> list[int]:
        return [self.FIRST_ID + ord(c) - 32 for c in text if 32 <= ord(c) < 127]

    def decode(self, tokens: list[int]) -> str:
        return "".join(chr(t - self.FIRST_ID + 32) for t in tokens if 10 <= t < 105)

    def eos_token_id(self) -> int:
        return 2


def test_pluggable_tokenizer(model_dir):
    tokenizer = CharTokenizer()
    engine = InferenceEngine(seed_config(model_dir), tokenizer=tokenizer)
    engine.submit_request("abc", GenerationParams(max_tokens=12, temperature=0.0))
    (result,) = engine.run()
    assert result.input_tokens == 3
    assert result.output_text == tokenizer.decode(result.output_tokens)
    # eos (2) comes from the plugged-in tokenizer: generation ends there, without it.
    assert 2 not in result.output_tokens[:-1]
    with pytest.raises(ConfigError, match="encode"):
        InferenceEngine(seed_config(model_dir), tokenizer=object())


def test_seed_config_file(model_dir, tmp_path):
    """The seed's config.json layout, as its README shows it."""
    path = tmp_path / "config.json"
    seed = {
        "block_size": 16,
        "max_num_blocks": 64,
        "max_batch_size": 32,
        "max_num_seqs": 256,
        "max_model_len": 256,
        "max_total_tokens": 4096,
        "memory_threshold": 0.9,
        "tokenizer": {"kind": "huggingface", "path": None},
        "serving": {"host": "127.0.0.1", "port": 3000, "model_name": "hetero-infer"},
    }
    path.write_text(json.dumps(seed))
    config = EngineConfig.from_file(path, model=str(model_dir))
    assert config.max_num_seqs == 32 and config.max_num_batched_tokens == 4096
    assert config.tokenizer is None
    engine = InferenceEngine(config)
    engine.submit_request("Hello", GenerationParams(max_tokens=2))
    assert len(engine.run()) == 1

    for key, value, message in [
        ("max_retry_attempts", 2, "not retried"),
        ("tokenizer", {"kind": "simple", "path": None}, "simple"),
        ("max_batch_size", 0, "max_batch_size"),
    ]:
        path.write_text(json.dumps({**seed, key: value}))
        with pytest.raises(ConfigError, match=message):
            EngineConfig.from_file(path)


# ---- mini-infer's API ----


def test_mini_infer_generate_keyword_form(model_dir):
    engine = LLMEngine(seed_config(model_dir, max_num_seqs=64, block_size=16))
    outputs = engine.generate(
        prompts=["Hello, how are you?"], max_tokens=100, temperature=0.8, top_p=0.95, top_k=50
    )
    (output,) = outputs
    assert isinstance(output, GenerateOutput)
    assert isinstance(output.text, str) and output.token_ids
    assert output.finish_reason in ("stop", "length")
    # Logprobs are computed only where asked, as in vLLM: the sum too.
    assert output.cumulative_logprob is None
    (asked,) = engine.generate(["Hello"], max_tokens=5, temperature=0.8, logprobs=0)
    assert asked.cumulative_logprob < 0
    # Greedy keyword form == the SamplingParams form.
    greedy = engine.generate(["a prompt"], max_tokens=10, temperature=0.0, use_tqdm=False)
    same = engine.generate(["a prompt"], SamplingParams(max_tokens=10, temperature=0.0))
    assert greedy[0].token_ids == same[0].token_ids
    with pytest.raises(ValidationError, match="not both"):
        engine.generate(["x"], SamplingParams(), max_tokens=3)
    with pytest.raises(ValidationError, match="no_such_field"):
        engine.generate(["x"], no_such_field=1)


def test_mini_infer_add_request_and_get_output(model_dir):
    engine = LLMEngine(seed_config(model_dir))
    request_id = engine.add_request(
        prompt="Write a poem", max_tokens=5, sampling_params=SamplingParams(temperature=0.9)
    )
    plain = engine.add_request("Write a poem", max_tokens=3)
    assert isinstance(request_id, str)
    assert engine.get_output(request_id) is None  # not ready yet
    outputs = {}
    while len(outputs) < 2:
        engine.step()
        for req_id in (request_id, plain):
            output = engine.get_output(req_id)
            if output:
                outputs[req_id] = output
    assert outputs[request_id].finished and len(outputs[request_id].token_ids) <= 5
    assert outputs[plain].finish_reason in ("stop", "length")
    assert len(outputs[plain].token_ids) <= 3


def test_typed_errors(model_dir):
    with pytest.raises(ModelNotFoundError, match="no-such-model") as caught:
        LLMEngine(EngineConfig(model="./no-such-model"))
    assert isinstance(caught.value, ConfigError | ValueError | EngineError)
    with pytest.raises(OutOfMemoryError) as caught:
        LLMEngine(seed_config(model_dir, max_num_blocks=2))
    assert isinstance(caught.value, MemoryError) and isinstance(caught.value, ValueError)
    with pytest.raises(ConfigError, match="block_size"):
        EngineConfig(block_size=0)
    engine = LLMEngine(seed_config(model_dir))
    with pytest.raises(InvalidRequestError, match="prompt") as caught:
        engine.add_request([BYTE_FALLBACK_VOCAB_SIZE + 5])
    assert caught.value.param == "prompt"
    with pytest.raises(InvalidRequestError) as caught:
        SamplingParams(top_p=2.0)
    assert caught.value.param == "top_p" and isinstance(caught.value, ValueError)
    assert issubclass(SchedulerError, EngineError) and issubclass(ExecutionError, EngineError)
    assert not issubclass(ExecutionError, ValueError)
