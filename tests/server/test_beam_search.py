"""use_beam_search on /v1/completions and /v1/chat/completions, through the real engine:
the n beams are the choices, best first, as the engine's own search (which
tests/engine/entrypoints/test_beam_search.py holds to transformers) gives them; streams send each
beam whole at the end; what the search cannot honour is a 400 naming the field; no KV
block is held after a search, also one whose client went away.

The tiny Llama here ends its text with token 251 as well as 2, so that beams end by
eos at different lengths (see tests/engine/entrypoints/test_beam_search.py).
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hetero_infer.engine.entrypoints.beam_search import BeamSearchParams
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL_NAME, make_engine, start_server, wait_until
from tests.server.openai_shapes import check_error_body
from tests.tiny_models import save_tiny_model

PROMPTS = ["Once upon a time", "The quick brown fox"]
MESSAGES = [{"role": "user", "content": "Hello there, is it working?"}]
BEAM = {"use_beam_search": True, "length_penalty": 0.5, "early_stopping": True}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama-eos"), eos_token_id=251)


@pytest.fixture(scope="module")
def server(folder):
    live = start_server(folder)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def reference(folder):
    """An engine of its own, for the expected beams (the server's is busy)."""
    return make_engine(folder)


@pytest.fixture(scope="module")
def http(server):
    with server.client() as client:
        yield client


def expected_beams(reference, prompt, n: int, max_tokens: int):
    params = BeamSearchParams(
        beam_width=n, max_tokens=max_tokens, length_penalty=0.5, early_stopping=True
    )
    return reference.beam_search(prompt, params)


def completion(**fields):
    return {"model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 12, "n": 4, **BEAM, **fields}


def test_completion_choices_are_the_beams_best_first(http, server, reference):
    response = http.post("/v1/completions", json=completion(prompt=PROMPTS))
    assert response.status_code == 200, response.text
    body = response.json()
    choices = body["choices"]
    assert [c["index"] for c in choices] == list(range(8))  # prompt_index * n + beam
    generated = 0
    for i, prompt in enumerate(PROMPTS):
        expected = expected_beams(reference, prompt, 4, 12)
        mine = choices[4 * i : 4 * (i + 1)]
        assert [c["text"] for c in mine] == [o.text for o in expected]
        assert [c["finish_reason"] for c in mine] == [o.finish_reason for o in expected]
        generated += sum(len(o.token_ids) for o in expected)
    assert {c["finish_reason"] for c in choices} == {"stop", "length"}  # eos is exercised
    prompt_tokens = sum(len(reference.tokenizer.encode(p)) for p in PROMPTS)
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": prompt_tokens + generated,
    }
    assert server.state.engine.num_pending == 0
    assert server.engine.memory_stats()["used_blocks"] == 0


def test_width_1_is_greedy(http):
    plain = {"model": MODEL_NAME, "max_tokens": 12, "temperature": 0}
    for prompt in PROMPTS:
        greedy = http.post("/v1/completions", json={**plain, "prompt": prompt})
        beam = http.post("/v1/completions", json=completion(prompt=prompt, n=1))
        assert beam.status_code == greedy.status_code == 200
        assert beam.json()["choices"] == greedy.json()["choices"]


def test_completion_stream_sends_each_beam_whole(http, reference):
    body = completion(stream=True, echo=True, stream_options={"include_usage": True})
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    beams = [c["choices"][0] for c in chunks if c["choices"]]
    expected = expected_beams(reference, PROMPTS[0], 4, 12)
    assert [b["index"] for b in beams] == [0, 1, 2, 3]
    assert [b["text"] for b in beams] == [PROMPTS[0] + o.text for o in expected]
    assert [b["finish_reason"] for b in beams] == [o.finish_reason for o in expected]
    assert chunks[-1]["usage"]["completion_tokens"] == sum(len(o.token_ids) for o in expected)


def test_chat_choices_are_the_beams(http, server, reference):
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 10, "n": 3, **BEAM}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    prompt = reference.tokenizer.apply_chat_template(MESSAGES)
    expected = expected_beams(reference, prompt, 3, 10)
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert [c["message"]["content"] for c in choices] == [o.text for o in expected]
    assert [c["finish_reason"] for c in choices] == [o.finish_reason for o in expected]
    assert answer["usage"]["completion_tokens"] == sum(len(o.token_ids) for o in expected)
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
        assert stream.status_code == 200
        lines = [line[len("data: ") :] for line in stream.iter_lines() if line.startswith("data")]
    texts = ["", "", ""]
    for line in lines[:-1]:
        for choice in json.loads(line)["choices"]:
            texts[choice["index"]] += choice["delta"].get("content") or ""
    assert texts == [o.text for o in expected]
    assert server.engine.memory_stats()["used_blocks"] == 0


REFUSED = [
    ("completions", {"temperature": 0.8}, "temperature"),
    ("completions", {"top_p": 0.5}, "top_p"),
    ("completions", {"top_k": 5}, "top_k"),
    ("completions", {"min_p": 0.1}, "min_p"),
    ("completions", {"presence_penalty": 0.5}, "presence_penalty"),
    ("completions", {"repetition_penalty": 1.2}, "repetition_penalty"),
    ("completions", {"logit_bias": {"5": 1.0}}, "logit_bias"),
    ("completions", {"min_tokens": 2}, "min_tokens"),
    ("completions", {"stop": ["x"]}, "stop"),
    ("completions", {"logprobs": 2}, "logprobs"),
    ("completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("completions", {"best_of": 2}, "best_of"),
    # Two eos tokens: a beam weighs (1 + 2) * n candidates, and a round computes 20.
    ("completions", {"n": 7}, "n"),
    ("completions", {"early_stopping": "sometimes"}, "early_stopping"),
    ("completions", {"use_beam_search": False, "length_penalty": 2.0}, "length_penalty"),
    (
        "completions",
        {"use_beam_search": False, "length_penalty": 1, "early_stopping": True},
        "early_stopping",
    ),
    ("chat", {"logprobs": True}, "logprobs"),
    ("chat", {"temperature": 1.0}, "temperature"),
    (
        "chat",
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tool_choice": "required",
        },
        "tool_choice",
    ),
]


@pytest.mark.parametrize(("route", "fields", "param"), REFUSED)
def test_what_the_search_cannot_honour_is_refused(http, server, route, fields, param):
    if route == "chat":
        body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 4, "n": 2, **BEAM}
        response = http.post("/v1/chat/completions", json={**body, **fields})
    else:
        response = http.post("/v1/completions", json=completion(**fields))
    assert response.status_code == 400, response.text
    error = check_error_body(response.json())
    assert error["param"] == param, error
    assert server.engine.memory_stats()["used_blocks"] == 0


def test_neutral_values_are_accepted(http):
    neutral = {"temperature": 0, "top_p": 1, "top_k": -1, "seed": 3, "stop": [], "n": 6}
    response = http.post("/v1/completions", json=completion(max_tokens=3, **neutral))
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 6


def aborted(http) -> float:
    """vllm:request_success_total{finished_reason="abort"}."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(http.get("/metrics").text)
        if family.name == "vllm:request_success"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["finished_reason"] == "abort"
    )


def test_client_that_leaves_frees_the_blocks(server, http):
    counters = server.engine.core.counters
    steps_before = counters.num_steps
    aborted_before = aborted(http)
    with server.client(timeout=0.5) as impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post("/v1/completions", json=completion(max_tokens=400, ignore_eos=True))

    def stepping_stopped() -> bool:
        # Between two rounds nothing is pending for a moment: wait for steps to stop.
        steps = counters.num_steps
        time.sleep(0.3)
        return steps == counters.num_steps and server.state.engine.num_pending == 0

    wait_until(stepping_stopped, 30, "the search's rounds to stop")
    # The whole search takes 400 rounds, a step each: it was cut short.
    assert counters.num_steps - steps_before < 300
    assert server.engine.memory_stats()["used_blocks"] == 0
    assert aborted(http) - aborted_before == 4  # each of its beams
    assert http.post("/v1/completions", json=completion(max_tokens=2)).status_code == 200


def test_time_limit_ends_the_search_with_the_beams_it_has(http, server):
    body = completion(max_tokens=400, ignore_eos=True, timeout=0.5)
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert len(choices) == 4
    assert all(c["finish_reason"] == "length" for c in choices)
    assert response.json()["usage"]["completion_tokens"] < 4 * 400
    assert server.engine.memory_stats()["used_blocks"] == 0
