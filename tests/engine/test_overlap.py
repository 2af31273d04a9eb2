"""overlap_steps: the model pass of step N beside the detokenization of step N-1 gives
the same outputs as the serial loop, streams them, and frees every block."""

from __future__ import annotations

import dataclasses

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.engine.test_llm_engine import run_to_end
from tests.tiny_models import save_tiny_model

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = ["hello world", [5, 6, 7, 8], "a longer prompt that takes a few chunks to prefill"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def make_engine(model_dir, overlap: bool) -> LLMEngine:
    # A small token budget: prompts are prefilled in chunks, beside other decodes.
    config = EngineConfig(
        model=str(model_dir),
        max_model_len=256,
        max_num_blocks=64,
        max_num_batched_tokens=16,
        overlap_steps=overlap,
    )
    return LLMEngine(config)


def fields(out) -> tuple:
    return (
        out.token_ids,
        out.text,
        out.finish_reason,
        out.stop_reason,
        out.cumulative_logprob,
        out.logprobs,
        out.prompt_logprobs,
    )


def test_off_by_default():
    assert not EngineConfig().overlap_steps


def test_same_outputs_as_the_serial_loop(model_dir):
    serial, overlapped = make_engine(model_dir, False), make_engine(model_dir, True)
    plain = serial.generate(PROMPTS, GREEDY, use_tqdm=False)
    # Stops taken from the serial run's own text and tokens, so that they do trigger:
    # a stop string is found one step after its token (the step beside it computes one
    # token more, which must not show), a stop token in the step it is sampled.
    stop_text = plain[0].text[len(plain[0].text) // 2 :][:3]
    stop_token = plain[1].token_ids[4]
    params = [
        dataclasses.replace(GREEDY, stop=[stop_text]),
        dataclasses.replace(GREEDY, stop_token_ids=[stop_token], logprobs=2),
        SamplingParams(max_tokens=9, temperature=0.8, seed=7, n=2, prompt_logprobs=1),
    ]
    expected = [fields(o) for o in serial.generate(PROMPTS, params, use_tqdm=False)]
    actual = [fields(o) for o in overlapped.generate(PROMPTS, params, use_tqdm=False)]
    assert actual == expected
    assert expected[0][2:4] == ("stop", stop_text) and expected[1][2:4] == ("stop", stop_token)
    for engine in (serial, overlapped):
        assert engine.memory_stats()["used_blocks"] == 0


def test_outputs_come_one_step_later_and_stream_the_final_text(model_dir):
    engine = make_engine(model_dir, True)
    request_id = engine.add_request([5, 6, 7], GREEDY)
    assert engine.step() == []  # the first token is being detokenized next step
    streamed = run_to_end(engine)
    out = engine.get_output(request_id)
    assert out.finished and len(out.token_ids) == 12 and streamed[request_id] == out.text
    assert engine.metrics.as_dict()["tokens_generated"] == 12
    assert not engine.has_pending_work()


def test_abort_between_steps_frees_blocks_and_spares_the_others(model_dir):
    engine = make_engine(model_dir, True)
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    for _ in range(5):
        engine.step()
    assert engine.abort(ids[1])
    assert all(seq.request_id != ids[1] for seq in engine._unsent)
    run_to_end(engine)
    assert engine.get_output(ids[1]).finish_reason == "abort"
    for request_id in (ids[0], ids[2]):
        out = engine.get_output(request_id)
        assert out.finish_reason == "length" and len(out.token_ids) == 12
    assert engine.memory_stats()["used_blocks"] == 0


def test_aborting_everything_leaves_no_pending_work(model_dir):
    engine = make_engine(model_dir, True)
    request_id = engine.add_request([5, 6, 7], GREEDY)
    engine.step()
    engine.step()
    assert engine._unsent  # the last step's tokens wait to be sent
    assert engine.abort(request_id)
    assert not engine.has_pending_work() and engine.step() == []
