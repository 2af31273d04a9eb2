"""An engine on bf16 weights runs each projection's rows on the kernel its measured
choice gives them (kernels/linear_choice.py), says so at start, and keeps its answers."""

from __future__ import annotations

import logging

import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.kernels import linear_choice, linear_cpu
from hetero_infer.kernels.linear_choice import KERNEL, ONEDNN, TIMED_ROWS

from tests.tiny_models import save_tiny_llama_in_panels

pytestmark = [
    pytest.mark.cpu_kernels("linear_packed"),
    pytest.mark.skipif(
        not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN's bf16 matmul"
    ),
]
# Ours at 1 and 9-32 rows, oneDNN at 2-8 and from 33 on.
MIXED = {KERNEL: (1.0,) * 5, ONEDNN: (2.0, 0.5, 2.0, 0.5, 0.5)}


def fake_timer(*args: object):
    def time_call(kind: str, rows: int) -> float:
        return MIXED[kind][TIMED_ROWS.index(rows)]

    return time_call


@pytest.fixture
def folder(tmp_path):
    return save_tiny_llama_in_panels(tmp_path / "llama")


def prompt_logprobs(engine: LLMEngine, prompt: list[int]) -> list[float]:
    params = SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=0)
    out = engine.generate([prompt], params, use_tqdm=False)[0]
    return [next(iter(entry.values())) for entry in out.prompt_logprobs[1:]]


def test_a_split_choice_runs_and_is_logged(folder, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(linear_choice, "_MEASURED", {})  # nothing measured before
    monkeypatch.setattr(linear_choice, "CACHE_PATH", tmp_path / "choices.json")
    monkeypatch.setattr(linear_cpu, "copies_timer", fake_timer)
    with caplog.at_level(logging.INFO):
        engine = LLMEngine(
            EngineConfig(model=str(folder), dtype="bfloat16", cpu_linear_kernel="measure")
        )
    for shape in ("96x64", "64x64", "256x64 gated", "64x128", "384x64"):
        assert f"{shape}: kernel/onednn/kernel/onednn/onednn (measured" in caplog.text
    # the one-call decoder stack takes only the steps whose rows ours runs everywhere
    assert engine.runner.fast_path.stack.buckets_served == (True, False, True, False, False)
    assert "96x64" in (tmp_path / "choices.json").read_text()

    # a prompt's rows run where the choice puts them: its logprobs are those of an engine
    # forced onto that kernel, to the bit
    forced = {
        mode: LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", cpu_linear_kernel=mode))
        for mode in (KERNEL, ONEDNN)
    }
    for prompt_length, kernel in ((5, ONEDNN), (20, KERNEL), (40, ONEDNN)):
        prompt = [(7 * i + 3) % 370 + 10 for i in range(prompt_length)]
        assert prompt_logprobs(engine, prompt) == prompt_logprobs(forced[kernel], prompt)
    assert prompt_logprobs(forced[KERNEL], prompt) != prompt_logprobs(forced[ONEDNN], prompt)


@pytest.mark.parametrize("mode", ["kernel", "onednn", "rule"])
def test_other_modes_time_nothing(folder, monkeypatch, mode):
    def no_timing(*args: object):
        raise AssertionError("timed")

    monkeypatch.setattr(linear_cpu, "copies_timer", no_timing)
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", cpu_linear_kernel=mode))
    out = engine.generate(["hello there"], SamplingParams(max_tokens=4), use_tqdm=False)
    assert len(out[0].token_ids) == 4
    # oneDNN everywhere leaves the decoder stack nothing of ours to run
    assert (engine.runner.fast_path is None) == (mode == "onednn")
