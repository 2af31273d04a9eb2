"""`hetero-infer tune`: the model's bf16 projections timed, kept and printed."""

from __future__ import annotations

import json

import pytest
import torch
from hetero_infer.kernels import linear_choice
from hetero_infer.server import tune
from hetero_infer.server.cli import main

from tests.server.command_recorders import record_set_up_and_shutdown
from tests.tiny_models import save_tiny_llama_in_panels, save_tiny_model

pytestmark = [
    pytest.mark.cpu_kernels("linear_packed"),
    pytest.mark.skipif(
        not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN's bf16 matmul"
    ),
]


def test_tune_times_keeps_and_prints_the_choice(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "choices.json"
    monkeypatch.setattr(linear_choice, "CACHE_PATH", cache)
    monkeypatch.setattr(linear_choice, "_MEASURED", {})
    folder = save_tiny_llama_in_panels(tmp_path / "llama")
    argv = ["tune", "--model", str(folder), "--dtype", "bfloat16", "--cpu-linear-kernel", "rule"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "bf16 projections, by rows" in out and "256x64 gated: " in out  # the gate_up
    assert "(measured; ours/oneDNN time " in out  # measured whatever the setting says
    (machine,) = json.loads(cache.read_text()).values()
    assert "256x64 gated" in machine and f"kept in {cache}" in out


def test_tune_says_when_there_is_nothing_to_choose(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(linear_choice, "CACHE_PATH", tmp_path / "choices.json")
    calls = record_set_up_and_shutdown(monkeypatch, tune)
    folder = save_tiny_model("llama", tmp_path / "llama")
    assert main(["tune", "--model", str(folder), "--dtype", "float32"]) == 0
    assert "nothing to choose" in capsys.readouterr().out
    assert calls == ["process", "shutdown"]
