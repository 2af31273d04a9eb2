"""bench/step_time.py without a GPU: the timed runner's record, the decode steps it
times on a real engine (the tiny model on the CPU), and the refusal without a GPU."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine

from bench import step_time
from tests.tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = save_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    engine = LLMEngine(EngineConfig(model=str(folder), max_num_seqs=8, max_model_len=256))
    yield engine
    engine.shutdown()


def test_the_timed_runner_keeps_each_steps_time_and_passes_the_rest_on(engine):
    runner = engine.core.runner
    timed = step_time.TimedRunner(runner)
    engine.core.runner = timed
    try:
        times = step_time.decode_steps(engine, 3, 5, 10)
    finally:
        engine.core.runner = runner
    assert len(times) == 5 and all(t > 0 for t in times)
    # the prompts' step, the 5 timed, the last 4 (each request runs to 9 tokens)
    assert len(timed.seconds) == 1 + 5 + 3
    assert timed.num_blocks == runner.num_blocks
    assert not engine.has_pending_work()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_refuses(capsys):
    assert step_time.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
