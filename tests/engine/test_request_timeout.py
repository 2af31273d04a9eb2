"""A request's time limit in LLMEngine, on a tiny random Llama: a request that runs past
it ends between two steps ("length" with its tokens so far, or "abort" before its
first), frees its blocks at once and is counted; the others in the batch go on as if
it had never been there. Also the priority check and the limit's arithmetic.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams, ValidationError
from hetero_infer.engine.params.sampling_params import RequestOutputKind

from tests.tiny_models import save_tiny_model

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def make_engine(model_dir, **settings) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=str(model_dir), max_model_len=256, max_num_blocks=64, **settings)
    )


def run_to_end(engine: LLMEngine) -> dict[str, list]:
    """Step until idle; request id -> its outputs."""
    outputs: dict[str, list] = {}
    while engine.has_pending_work():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def test_a_request_out_of_time_before_its_first_token_is_aborted(model_dir):
    engine = make_engine(model_dir)
    request_id = engine.add_request([5, 6, 7], GREEDY, timeout=1e-6)
    outputs = run_to_end(engine)
    [final] = outputs[request_id]
    assert final.finished and final.finish_reason == "abort" and final.token_ids == []
    assert engine.metrics.num_timeouts == 1
    assert engine.memory_stats()["used_blocks"] == 0


def test_a_request_out_of_time_ends_with_its_tokens_so_far(model_dir):
    engine = make_engine(model_dir)
    expected = make_engine(model_dir).generate([[9, 8, 7]], GREEDY, use_tqdm=False)[0]
    other = engine.add_request([9, 8, 7], GREEDY)
    timed = engine.add_request([5, 6, 7], LONG, timeout=0.2)
    # The limit is checked before each step: this one checks it at once, and gives
    # the request its first token.
    outputs = engine.step()
    time.sleep(0.25)
    rest = run_to_end(engine)
    final = rest[timed][-1]
    assert final.finished and final.finish_reason == "length"
    assert 1 <= len(final.token_ids) < LONG.max_tokens
    streamed = [o for o in outputs + rest[timed] if o.request_id == timed]
    assert sum(len(o.delta_token_ids) for o in streamed) == len(final.token_ids)
    assert "".join(o.delta_text for o in streamed) == final.text
    # The other request ran on, unchanged by its neighbour's end.
    assert rest[other][-1].token_ids == expected.token_ids
    assert engine.metrics.num_timeouts == 1
    stats = engine.memory_stats()
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0


def test_an_answer_sent_whole_has_its_text_when_out_of_time(model_dir):
    """FINAL_ONLY decodes its tokens at its end (the output processor): an end by the
    time limit, which brings no token, still gives their text."""
    engine = make_engine(model_dir)
    params = dataclasses.replace(LONG, output_kind=RequestOutputKind.FINAL_ONLY)
    timed = engine.add_request([5, 6, 7], params, timeout=0.5)
    for _ in range(4):
        assert engine.step() == []  # nothing goes out before the end
    time.sleep(0.55)
    [final] = run_to_end(engine)[timed]
    assert final.finish_reason == "length" and len(final.token_ids) == 4
    expected = engine.tokenizer.decode([5, 6, 7] + final.token_ids)
    assert final.text and final.text == expected[len(engine.tokenizer.decode([5, 6, 7])) :]


def test_every_choice_of_a_request_ends_with_it(model_dir):
    engine = make_engine(model_dir)
    params = SamplingParams(n=3, max_tokens=200, temperature=1.0, seed=1, ignore_eos=True)
    request_id = engine.add_request([5, 6, 7], params, timeout=0.2)
    engine.step()  # the first token: the other choices fork from it
    time.sleep(0.25)
    run_to_end(engine)
    finals = [engine.get_output(f"{request_id}#{i}" if i else request_id) for i in range(3)]
    assert all(f is not None and f.finish_reason in ("length", "abort") for f in finals)
    assert all(len(f.token_ids) < 200 for f in finals)
    assert engine.metrics.num_timeouts == 1  # one request, however many choices
    assert engine.memory_stats()["used_blocks"] == 0


def test_the_engine_limit_caps_a_request_that_asks_for_more(model_dir):
    engine = make_engine(model_dir, request_timeout=0.2)
    processor = engine.input_processor
    prompt = processor.tokenize([1, 2, 3])
    for timeout, limit in ((100.0, 0.2), (0.05, 0.05), (None, 0.2)):
        before = time.monotonic()
        deadline = processor.request("r", prompt, GREEDY, timeout=timeout).deadline
        assert before + limit <= deadline <= time.monotonic() + limit
    assert make_engine(model_dir).input_processor.request("r", prompt, GREEDY).deadline is None


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), float("nan"), True, "5"])
def test_bad_timeouts_are_refused(model_dir, timeout):
    engine = make_engine(model_dir)
    with pytest.raises(ValidationError) as info:
        engine.add_request([1, 2, 3], GREEDY, timeout=timeout)
    assert info.value.param == "timeout"
    assert not engine.has_pending_work()


def test_a_priority_needs_the_priority_policy(model_dir):
    engine = make_engine(model_dir)
    engine.add_request([1, 2, 3], GREEDY, priority=0)
    with pytest.raises(ValidationError, match="--scheduling-policy priority") as info:
        engine.add_request([1, 2, 3], GREEDY, priority=1)
    assert info.value.param == "priority"
    engine = make_engine(model_dir, scheduling_policy="priority")
    engine.add_request([1, 2, 3], GREEDY, priority=-3)  # any integer, lower first
    with pytest.raises(ValidationError):
        engine.add_request([1, 2, 3], GREEDY, priority=1.5)


def test_config_refuses_priority_with_swap_and_bad_limits():
    with pytest.raises(ValueError, match="recompute"):
        EngineConfig(scheduling_policy="priority", num_cpu_blocks=8)
    EngineConfig(scheduling_policy="priority", num_cpu_blocks=8, preemption_mode="recompute")
    with pytest.raises(ValueError, match="scheduling_policy"):
        EngineConfig(scheduling_policy="lifo")
    for bad in (0, -1, float("inf"), "10"):
        with pytest.raises(ValueError, match="request_timeout"):
            EngineConfig(request_timeout=bad)
    for bad in (0, -1, float("inf"), "10"):
        with pytest.raises(ValueError, match="max_queue_time"):
            EngineConfig(max_queue_time=bad)


def test_a_request_that_waits_past_max_queue_time_is_rejected(model_dir):
    """max_queue_time: a request that could not start in time ends "rejected", never
    scheduled and holding no block (the server answers 503); the running one goes on,
    and a later one starts normally."""
    engine = make_engine(model_dir, max_num_seqs=1, max_queue_time=0.2)
    running = engine.add_request([9, 8, 7], LONG)
    engine.step()  # running is scheduled: it has started, it is never rejected
    waiting = engine.add_request([5, 6, 7], GREEDY, request_id="waiting")
    choices = engine.add_request([4, 5], SamplingParams(n=3, max_tokens=4), request_id="n")
    time.sleep(0.25)
    outputs = engine.step()
    rejected = {out.request_id: out for out in outputs if out.finish_reason == "rejected"}
    assert set(rejected) == {"waiting", "n", "n#1", "n#2"}  # every choice of a request
    assert all(out.finished and out.token_ids == [] for out in rejected.values())
    assert engine.metrics.num_rejected == 2
    rest = run_to_end(engine)
    assert rest[running][-1].finish_reason == "length"
    assert waiting not in rest and choices not in rest
    assert engine.memory_stats()["used_blocks"] == 0
    later = engine.add_request([5, 6, 7], GREEDY)
    assert run_to_end(engine)[later][-1].finish_reason == "length"
