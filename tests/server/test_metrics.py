"""/metrics: vLLM's names, types, labels and buckets, and values that follow the requests."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL_NAME, LiveServer

# vLLM's buckets (vllm/v1/metrics/loggers.py), written out here on purpose.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5]
TTFT_BUCKETS += [5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0]
ITL_BUCKETS += [7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0]
REQUEST_BUCKETS += [60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
N_BUCKETS = [1.0, 2.0, 5.0, 10.0, 20.0]
STEP_TOKEN_BUCKETS = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0]
STEP_TOKEN_BUCKETS += [4096.0, 8192.0, 16384.0]

GAUGES = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"]
COUNTERS = [
    "prompt_tokens",
    "generation_tokens",
    "num_preemptions",
    "request_success",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prompt_tokens_cached",
]
HISTOGRAMS = {
    "time_to_first_token_seconds": TTFT_BUCKETS,
    "inter_token_latency_seconds": ITL_BUCKETS,
    "request_time_per_output_token_seconds": ITL_BUCKETS,
    "e2e_request_latency_seconds": REQUEST_BUCKETS,
    "request_queue_time_seconds": REQUEST_BUCKETS,
    "request_params_n": N_BUCKETS,
    "iteration_tokens_total": STEP_TOKEN_BUCKETS,
}


def scrape(http: httpx.Client) -> dict:
    """name (without "vllm:") -> parsed family."""
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        family.name.removeprefix("vllm:"): family
        for family in text_string_to_metric_families(response.text)
        if family.name.startswith("vllm:")
    }


def value(families: dict, name: str, suffix: str = "", **labels: str) -> float:
    """The sum of a family's samples named name+suffix whose labels include ``labels``."""
    full = f"vllm:{name}{suffix}"
    return sum(
        s.value
        for s in families[name].samples
        if s.name == full and labels.items() <= s.labels.items()
    )


def changes(before: dict, after: dict) -> Callable[..., float]:
    """``delta(name, suffix, **labels)``: how much ``value`` moved between two scrapes."""

    def delta(name: str, suffix: str = "", **labels: str) -> float:
        return value(after, name, suffix, **labels) - value(before, name, suffix, **labels)

    return delta


def test_names_types_and_buckets(server: LiveServer):
    with server.client() as http:
        http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
        families = scrape(http)
    for name in GAUGES:
        assert families[name].type == "gauge", name
        [sample] = families[name].samples
        assert sample.labels == {"model_name": MODEL_NAME}
    for name in COUNTERS:
        assert families[name].type == "counter", name
        assert all(s.name == f"vllm:{name}_total" for s in families[name].samples if s.labels)
    for name, buckets in HISTOGRAMS.items():
        family = families[name]
        assert family.type == "histogram", name
        bounds = [float(s.labels["le"]) for s in family.samples if s.name == f"vllm:{name}_bucket"]
        assert bounds == [*buckets, math.inf], name
        assert all(s.labels["model_name"] == MODEL_NAME for s in family.samples)
        assert {s.name for s in family.samples} >= {
            f"vllm:{name}_bucket",
            f"vllm:{name}_count",
            f"vllm:{name}_sum",
        }
    reasons = {s.labels["finished_reason"] for s in families["request_success"].samples}
    assert reasons and reasons <= {"length", "stop", "abort"}


def test_values_follow_requests(server: LiveServer):
    prompt = "Hello world and the " * 4  # several full KV blocks: the second run hits the cache
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 6, "ignore_eos": True}
    chat = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with server.client() as http:
        before = scrape(http)
        usages = [http.post("/v1/completions", json=body).json()["usage"] for _ in range(2)]
        stream = http.post("/v1/chat/completions", json=chat)
        usage_line = [line for line in stream.text.splitlines() if '"usage"' in line][-1]
        usages.append(json.loads(usage_line.removeprefix("data: "))["usage"])
        after = scrape(http)

    delta = changes(before, after)

    num_requests = len(usages)
    prompt_tokens = sum(u["prompt_tokens"] for u in usages)
    completion_tokens = sum(u["completion_tokens"] for u in usages)
    assert completion_tokens == 6 + 6 + 5
    assert delta("prompt_tokens", "_total") == prompt_tokens
    assert delta("generation_tokens", "_total") == completion_tokens
    assert delta("request_success", "_total", finished_reason="length") == num_requests
    assert delta("request_success", "_total") == num_requests
    assert delta("num_preemptions", "_total") == 0
    assert delta("prefix_cache_queries", "_total") >= prompt_tokens - num_requests
    assert delta("prefix_cache_hits", "_total") > 0
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert delta(name, "_count") == num_requests, name
        assert delta(name, "_sum") > 0, name
    assert delta("request_queue_time_seconds", "_count") == num_requests
    assert delta("inter_token_latency_seconds", "_count") == completion_tokens - num_requests
    # A request's own time per output token: its decode time over its later tokens.
    assert delta("request_time_per_output_token_seconds", "_count") == num_requests
    tpot_sum = delta("request_time_per_output_token_seconds", "_sum")
    assert 0 < tpot_sum <= delta("request_decode_time_seconds", "_sum")
    # The second completion found the first one's blocks: what each request computed
    # and what the cache held add up to its prompt.
    cached = delta("prompt_tokens_cached", "_total")
    assert cached >= 16
    assert delta("request_prefill_kv_computed_tokens", "_sum") == prompt_tokens - cached
    assert delta("request_prefill_kv_computed_tokens", "_count") == num_requests
    # Each histogram's +Inf bucket holds all of its observations.
    for name in HISTOGRAMS:
        assert delta(name, "_bucket", le="+Inf") == delta(name, "_count"), name
    # Idle again.
    for name in GAUGES:
        assert value(after, name) == 0, name


def test_a_beam_search_counts_each_beam_once(server: LiveServer):
    """A beam search's n beams are n finished choices to the metrics, each observed
    once, whole (its outputs come at the search's end: no stream of deltas to time)."""
    body = {
        "model": MODEL_NAME,
        "prompt": "Hello world and the",
        "max_tokens": 4,
        "n": 2,
        "use_beam_search": True,
        "ignore_eos": True,
    }
    with server.client() as http:
        before = scrape(http)
        answer = http.post("/v1/completions", json=body).json()
        after = scrape(http)
    assert len(answer["choices"]) == 2

    delta = changes(before, after)

    assert delta("request_success", "_total") == 2
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert delta(name, "_count") == 2, name


def test_each_choice_is_timed_on_its_own(server: LiveServer):
    """A request's n choices each have a first token and gaps between their own tokens,
    streamed or not (vLLM times each choice apart): one first token and one gap for
    every choice's later tokens."""
    body = {
        "model": MODEL_NAME,
        "prompt": "Hello world and the",
        "max_tokens": 5,
        "n": 3,
        "temperature": 1.0,
        "ignore_eos": True,
    }
    for stream in (False, True):
        with server.client() as http:
            before = scrape(http)
            http.post("/v1/completions", json={**body, "stream": stream}).raise_for_status()
            after = scrape(http)
        delta = changes(before, after)
        assert delta("time_to_first_token_seconds", "_count") == 3, stream
        assert delta("inter_token_latency_seconds", "_count") == 3 * 4, stream
        assert delta("request_success", "_total", finished_reason="length") == 3, stream
        # Request-wide: one observation of n, and of the longest choice's tokens.
        assert delta("request_params_n", "_count") == 1, stream
        assert delta("request_params_n", "_sum") == 3, stream
        for name in ("request_max_num_generation_tokens", "max_num_generation_tokens"):
            assert delta(name, "_count") == 1, (name, stream)
            assert delta(name, "_sum") == 5, (name, stream)


def test_each_step_counts_the_tokens_it_ran(server: LiveServer):
    """vllm:iteration_tokens_total: a step a token, the first one running the prompt (one
    chunk, nothing of it cached) and each later one the token sampled before it."""
    body = {
        "model": MODEL_NAME,
        "prompt": "Steps counted here: a quartz zebra juggles seven violet kumquats",
        "max_tokens": 4,
        "ignore_eos": True,
    }
    with server.client() as http:
        before = scrape(http)
        answer = http.post("/v1/completions", json=body).json()
        after = scrape(http)
    delta = changes(before, after)
    assert answer["usage"]["completion_tokens"] == 4
    assert delta("iteration_tokens_total", "_count") == 4
    assert delta("iteration_tokens_total", "_sum") == answer["usage"]["prompt_tokens"] + 3
    # The prompt's step is past the 8-token bucket, the three decodes in the first.
    assert delta("iteration_tokens_total", "_bucket", le="1.0") == 3
    assert delta("iteration_tokens_total", "_bucket", le="8.0") == 3
    assert delta("iteration_tokens_total", "_bucket", le="+Inf") == 4


def test_a_request_its_client_left_counts_as_aborted(server: LiveServer):
    """A stream whose client goes away after its first tokens: each choice is a finished
    request with reason "abort", its prompt and the tokens it had made counted (as the
    prompt_tokens_total counter counts its prompt)."""
    body = {
        "model": MODEL_NAME,
        "prompt": "Hello world and the",
        "max_tokens": 480,  # the tiny model's half a second, most of its context
        "n": 2,
        "ignore_eos": True,
        "stream": True,
    }
    with server.client() as http:
        before = scrape(http)
        with http.stream("POST", "/v1/completions", json=body) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    break
        deadline = time.monotonic() + 30
        while True:
            after = scrape(http)
            delta = changes(before, after)
            ended = delta("request_success", "_total") == 2
            idle = all(value(after, name) == 0 for name in GAUGES)
            if ended and idle or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert delta("request_success", "_total", finished_reason="abort") == 2
    assert delta("request_success", "_total") == 2
    assert delta("e2e_request_latency_seconds", "_count") == 2
    prompt_tokens = delta("prompt_tokens", "_total")
    assert prompt_tokens > 0
    assert delta("request_prompt_tokens", "_sum") == 2 * prompt_tokens
    assert 1 <= delta("request_generation_tokens", "_sum") < 2 * 480
    assert delta("request_params_n", "_count") == 1
    for name in GAUGES:
        assert value(after, name) == 0, name


LATENCIES = (
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "time_per_output_token_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_inference_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_time_per_output_token_seconds",
)


@pytest.mark.parametrize("stream", [False, True])
def test_latencies_lie_within_the_requests_time(server: LiveServer, stream: bool):
    """Every latency observed is a time within the requests' own: no sum passes the
    wall time of its observations. A request's time per output token is its decode time
    over its tokens after the first; one token has none (no observation, no error)."""
    body = {"model": MODEL_NAME, "prompt": "Hello world and the", "stream": stream}
    body |= {"ignore_eos": True}
    with server.client() as http:
        scrapes = [scrape(http)]
        started = time.monotonic()
        for max_tokens in (1, 2, 6):
            answer = http.post("/v1/completions", json={**body, "max_tokens": max_tokens})
            assert answer.status_code == 200, answer.text
            scrapes.append(scrape(http))
        elapsed = time.monotonic() - started
    delta = changes(scrapes[0], scrapes[-1])
    for name in LATENCIES:
        count = delta(name, "_count")
        assert count > 0, name
        assert 0 <= delta(name, "_sum") <= count * elapsed, name
    steps = [changes(a, b) for a, b in zip(scrapes, scrapes[1:], strict=False)]
    counts = [step("request_time_per_output_token_seconds", "_count") for step in steps]
    assert counts == [0, 1, 1]
    six = steps[-1]
    decode = six("request_decode_time_seconds", "_sum")
    assert six("request_time_per_output_token_seconds", "_sum") == pytest.approx(decode / 5)


def test_a_request_whose_client_left_before_any_output(server: LiveServer):
    """Not streamed, a request gives the server no output before its end: its choices
    end as aborted having made nothing the server saw."""
    body = {"model": MODEL_NAME, "prompt": "Hello world and the", "max_tokens": 480, "n": 2}
    with server.client() as http:
        before = scrape(http)
        with server.client(timeout=0.2) as impatient, pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/completions", json={**body, "ignore_eos": True})
        deadline = time.monotonic() + 30
        while True:
            after = scrape(http)
            delta = changes(before, after)
            idle = all(value(after, name) == 0 for name in GAUGES)
            if delta("request_success", "_total") == 2 and idle or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert delta("request_success", "_total", finished_reason="abort") == 2
    assert delta("request_generation_tokens", "_count") == 2
    assert delta("request_generation_tokens", "_sum") == 0
    assert delta("request_params_n", "_sum") == 2
