"""`hetero-infer --input ...`: one answer on the command line (server/cli.py's main) from
a real engine: the sampling flags reach the request, --chat wraps the prompt in the
model's template, and --json and the plain form print the same answer and stats."""

from __future__ import annotations

import json

import pytest
from hetero_infer.server import cli

from tests.server.command_recorders import (
    record_other_node,
    record_set_up_and_shutdown,
    under_torchrun,
)
from tests.tiny_models import save_tiny_model

TINY_FLAGS = ["--max-model-len", "64", "--max-num-blocks", "16", "--max-tokens", "12"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def one_shot(capsys, *argv: str) -> dict:
    """main()'s --json answer to ``argv``; it must exit 0."""
    assert cli.main(["--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_sampling_flags_reach_the_request(model_dir, capsys):
    def text(*flags: str) -> str:
        answer = one_shot(
            capsys, "--model", str(model_dir), "--input", "hello", *TINY_FLAGS, *flags
        )
        return answer["text"]

    greedy = text()  # --temperature 0 by default
    sampled = ("--temperature", "1", "--seed", "3")
    assert text(*sampled) == text(*sampled) != greedy
    assert text("--temperature", "1", "--seed", "4") != text(*sampled)
    # Each filter that keeps only the likeliest token makes the sampling greedy.
    for kept_alone in (("--top-k", "1"), ("--top-p", "1e-6"), ("--min-p", "1")):
        assert text(*sampled, *kept_alone) == greedy, kept_alone


def test_the_stats_and_the_plain_form(model_dir, capsys, monkeypatch):
    calls = record_set_up_and_shutdown(monkeypatch, cli)
    argv = ["--model", str(model_dir), "--input", "hello there", *TINY_FLAGS[:4]]
    answer = one_shot(capsys, *argv)
    assert calls == ["process", "shutdown"]
    assert answer["prompt_tokens"] > one_shot(capsys, *argv[:3], "hi", *TINY_FLAGS)["prompt_tokens"]
    # 16 tokens by default, unless the model ends its text before
    assert answer["completion_tokens"] == 16 or answer["finish_reason"] == "stop"
    assert answer["completion_tokens"] <= 16
    assert answer["load_seconds"] > 0
    assert 0 < answer["time_to_first_token"] <= answer["latency_seconds"]
    rate = answer["completion_tokens"] / answer["latency_seconds"]
    assert answer["tokens_per_second"] == pytest.approx(rate, rel=0.1)
    # Without --json: the text alone on stdout, the stats on stderr.
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert out == answer["text"] + "\n"
    assert err.startswith(f"-- prompt_tokens: {answer['prompt_tokens']}, completion_tokens: ")
    assert "finish_reason: " in err and "tokens_per_second: " in err


def test_other_nodes_and_torchrun_ranks_run_their_ranks_and_no_engine(monkeypatch, capsys):
    """Node 0's one-shot run stops the group, so the others do not drain."""
    ran = record_other_node(monkeypatch, returns=7)
    nodes = ["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1"]
    nodes += ["--dist-init-addr", "127.0.0.1:29500"]
    assert cli.main(["--input", "hi", *nodes]) == 7
    assert ran == [(1, 0.0)]
    monkeypatch.setattr(cli, "run_torchrun_worker", lambda config: ran.append(
        config.distributed_executor_backend) or 6)  # fmt: skip
    under_torchrun(monkeypatch, rank=1)
    assert cli.main(["--input", "hi", "--tensor-parallel-size", "2"]) == 6
    assert ran[1:] == ["external_launcher"]
    assert capsys.readouterr().out == ""


def test_a_bad_setting_for_tune_is_an_error(capsys):
    assert cli.main(["tune", "--pooling", "cls"]) == 2
    assert capsys.readouterr().err == "error: flags: pooling must be one of last, mean; got 'cls'\n"


@pytest.mark.slow
def test_chat_wraps_the_prompt_in_the_models_template(capsys):
    """The README's `make ask`, on the embedded model."""
    question = ["--input", "What is the capital of France? Answer with one word."]
    chat = one_shot(capsys, *question, "--chat", "--max-tokens", "8")
    assert "Paris" in chat["text"]
    plain = one_shot(capsys, *question, "--max-tokens", "1")
    # SmolLM2's template adds its system turn and the role markers.
    assert chat["prompt_tokens"] > plain["prompt_tokens"] + 10
