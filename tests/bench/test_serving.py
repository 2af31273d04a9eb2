"""bench.serving: its metrics on made-up timings, and one real run against our server.

OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/bench/test_serving.py
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import serving
from bench.serving import RequestRecord
from tests.server.conftest import LiveServer, start_server
from tests.tiny_models import save_tiny_model

# ---- metrics on made-up timings ----


def test_percentile_interpolates_linearly() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert serving.percentile(values, 50) == pytest.approx(2.5)
    assert serving.percentile(values, 0) == 1.0
    assert serving.percentile(values, 100) == 4.0
    # p99 of 1..100: rank 0.99 * 99 = 98.01 -> 99 + 0.01
    assert serving.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert serving.percentile([], 50) is None


def test_tpot_is_decode_time_per_token_after_the_first() -> None:
    # 0.5 s to the first token, 1.5 s in all, 11 tokens: 10 gaps over 1.0 s.
    assert serving.time_per_output_token(1.5, 0.5, 11) == pytest.approx(0.1)
    assert serving.time_per_output_token(1.5, 0.5, 1) is None  # no gap to measure
    assert serving.time_per_output_token(None, 0.5, 4) is None


def test_itl_is_the_gap_between_chunks() -> None:
    times = [0.5, 0.6, 0.75, 0.8]
    assert serving.inter_token_latencies(times) == pytest.approx([0.1, 0.15, 0.05])
    assert serving.inter_token_latencies([0.5]) == []


def test_itl_splits_a_chunk_of_several_tokens() -> None:
    # The third chunk brings 3 tokens after 0.3 s: three latencies of 0.1 s, not one
    # of 0.3 s; the first chunk's tokens are the TTFT's and add no latency.
    itl = serving.inter_token_latencies([0.5, 0.6, 0.9], [2, 1, 3])
    assert itl == pytest.approx([0.1, 0.1, 0.1, 0.1])


def test_chunk_token_counts() -> None:
    def count(text: str) -> int:
        return len(text.split())

    assert serving.chunk_token_counts(["a", "b", "c"], 3, count) == [1, 1, 1]
    # Fewer chunks than tokens: the total is shared by each chunk's re-tokenized text.
    assert serving.chunk_token_counts(["a b", "c", "d e f"], 6, count) == [2, 1, 3]
    # Re-tokenizing may over- or undercount; the counts still add up to the total.
    assert serving.chunk_token_counts(["a b c d", "e f g h"], 4, count) == [2, 2]
    assert serving.chunk_token_counts(["a", "b c"], 7, count) == [2, 5]
    assert sum(serving.chunk_token_counts(["x y z", "", "w"], 5, count)) == 5


def _record(index: int, ttft: float, e2e: float, tokens: int, itl: list[float]) -> RequestRecord:
    return RequestRecord(
        index, prompt_tokens=10, max_tokens=tokens, success=True, ttft=ttft, e2e=e2e,
        itl=itl, output_tokens=tokens,
    )  # fmt: skip


def test_summary_of_made_up_requests() -> None:
    records = [
        _record(0, 0.1, 0.5, 5, [0.1, 0.1, 0.1, 0.1]),  # tpot 0.1
        _record(1, 0.3, 1.1, 5, [0.2, 0.2, 0.2, 0.2]),  # tpot 0.2
        RequestRecord(2, prompt_tokens=10, max_tokens=5, error="HTTP 503: busy"),
    ]
    summary = serving.summarize(records, duration=2.0)
    assert summary["completed"] == 2
    assert summary["failed"] == 1
    assert summary["errors"] == ["HTTP 503: busy"]
    assert summary["total_input_tokens"] == 20  # completed requests only
    assert summary["total_output_tokens"] == 10
    assert summary["request_throughput"] == pytest.approx(1.0)
    assert summary["output_throughput"] == pytest.approx(5.0)
    assert summary["total_token_throughput"] == pytest.approx(15.0)
    assert summary["ttft"]["mean_ms"] == pytest.approx(200.0)
    assert summary["ttft"]["p50_ms"] == pytest.approx(200.0)
    assert summary["ttft"]["p99_ms"] == pytest.approx(100 + 200 * 0.99)
    assert summary["tpot"]["mean_ms"] == pytest.approx(150.0)
    assert summary["itl"]["mean_ms"] == pytest.approx(150.0)
    assert summary["itl"]["p50_ms"] == pytest.approx(150.0)
    assert summary["e2e"]["mean_ms"] == pytest.approx(800.0)
    assert summary["short_outputs"] == 0


def test_compare_takes_ratios_of_the_baseline() -> None:
    def result(label: str, throughput: float, ttft_ms: float) -> dict:
        records = [_record(0, ttft_ms / 1000, 1.0, 11, [0.01] * 10)]
        summary = serving.summarize(records, duration=11 / throughput)
        return {"label": label, "settings": {}, "summary": summary, "requests": []}

    comparison = serving.compare([result("peer", 10.0, 400.0), result("ours", 20.0, 100.0)], "ours")
    rows = {row["key"]: row for row in comparison["rows"]}
    assert rows["output_throughput"]["ratios"] == {"peer": pytest.approx(2.0)}
    assert rows["ttft.mean_ms"]["ratios"] == {"peer": pytest.approx(0.25)}
    table = serving.format_comparison(comparison)
    assert "ours/peer" in table and "output tokens/s" in table


def test_poisson_arrivals_are_seeded() -> None:
    gaps = serving._arrival_gaps(2000, 4.0, seed=3)
    assert gaps == serving._arrival_gaps(2000, 4.0, seed=3)
    assert gaps[0] == 0.0
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.1)
    assert serving._arrival_gaps(3, math.inf, seed=3) == [0.0, 0.0, 0.0]


# ---- a real run against our server on a tiny model ----


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def live(tiny_dir: Path) -> Iterator[LiveServer]:
    server = start_server(tiny_dir)
    yield server
    server.stop()


def test_random_prompts_are_seeded_and_about_the_length(tiny_dir: Path) -> None:
    tokenizer = serving.load_tokenizer(str(tiny_dir))
    prompts = serving.random_prompts(tokenizer, 4, 32, seed=0)
    assert prompts == serving.random_prompts(tokenizer, 4, 32, seed=0)
    assert prompts != serving.random_prompts(tokenizer, 4, 32, seed=1)
    for text, n in prompts:
        assert n == len(tokenizer.encode(text, add_special_tokens=False))
        assert abs(n - 32) <= 4


def test_a_run_against_our_server(live: LiveServer, tiny_dir: Path, tmp_path: Path) -> None:
    config = serving.BenchConfig(
        base_url=live.url + "/v1",
        model="tiny-llama",
        tokenizer=str(tiny_dir),
        num_prompts=6,
        prompt_len=24,
        output_len=8,
        request_rate=50.0,
        concurrency=3,
        label="tiny",
    )
    result = serving.benchmark(config)
    summary = result["summary"]
    assert summary["completed"] == 6, summary["errors"]
    assert summary["failed"] == 0
    # ignore_eos holds every request to max_tokens, and the usage chunk says so.
    assert summary["total_output_tokens"] == 6 * 8
    assert summary["short_outputs"] == 0
    for request in result["requests"]:
        assert request["success"] and request["tokens_from_usage"]
        assert request["output_tokens"] == 8
        assert 0 < request["ttft"] <= request["e2e"]
        assert request["tpot"] > 0
        # A token per latency, but those of the first chunk (the TTFT's): tokens of
        # the random model without text of their own ride in later chunks.
        assert 1 <= len(request["itl"]) <= 7
    assert summary["ttft"]["p99_ms"] >= summary["ttft"]["p50_ms"] > 0
    assert summary["output_throughput"] > 0

    json_path, png_path = serving.write_result(result, tmp_path)
    assert json.loads(json_path.read_text())["summary"]["completed"] == 6
    assert png_path.stat().st_size > 0

    # Two runs make one comparison table, JSON and chart.
    other = {**result, "label": "tiny-again"}
    table, paths = serving.write_comparison([result, other], tmp_path, "cmp")
    assert "tiny/tiny-again" in table
    assert all(p.stat().st_size > 0 for p in paths)
    # Each run, and so the comparison, says which CPU it was measured on.
    hosts = json.loads(paths[0].read_text())["hosts"]
    assert hosts["tiny"]["cpu"] and isinstance(hosts["tiny"]["cpu_flags"], list)
    assert hosts["tiny-again"] == result["host"]


def test_the_chat_workload_samples_with_a_seed_per_request(
    live: LiveServer, tiny_dir: Path
) -> None:
    config = serving.BenchConfig(
        base_url=live.url + "/v1",
        model="tiny-llama",
        tokenizer=str(tiny_dir),
        num_prompts=4,
        prompt_len=16,
        output_len=6,
        concurrency=4,
        warmup=0,
        workload="chat",
    )
    body = serving._request_body(config, "hi", 6, index=3)
    assert body["messages"] == [{"role": "user", "content": "hi"}] and "prompt" not in body
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.7, 0.95, 3)
    assert serving.request_route(config) == "/chat/completions"
    result = serving.benchmark(config)
    assert result["summary"]["completed"] == 4, result["summary"]["errors"]
    assert result["summary"]["total_output_tokens"] == 4 * 6
    # A seed per request: the same run gives the same texts.
    again = serving.benchmark(config)
    assert [r["text"] for r in again["requests"]] == [r["text"] for r in result["requests"]]


def test_a_failing_request_is_recorded_not_raised(live: LiveServer, tiny_dir: Path) -> None:
    config = serving.BenchConfig(
        base_url=live.url + "/v1",
        model="no-such-model",  # a 404 from the server
        tokenizer=str(tiny_dir),
        num_prompts=2,
        prompt_len=8,
        output_len=4,
        warmup=0,
    )
    summary = serving.benchmark(config)["summary"]
    assert summary["completed"] == 0
    assert summary["failed"] == 2
    assert "HTTP 404" in summary["errors"][0]
