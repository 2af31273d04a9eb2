"""bench.host_step's idle runner drives the real engine loop: every request decodes
the runner's token to its length, and the steps it times are whole decode steps."""

from __future__ import annotations

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine

from bench.host_step import IdleRunner, decode_step_times
from tests.tiny_models import save_tiny_model


@pytest.mark.parametrize(
    ("async_scheduling", "final_only"), [(False, False), (True, False), (False, True)]
)
def test_the_idle_runner_decodes_every_request_to_its_length(
    tmp_path, async_scheduling, final_only
):
    folder = save_tiny_model("llama", tmp_path)
    engine = LLMEngine(EngineConfig(model=str(folder), async_scheduling=async_scheduling))
    finished, unfinished = [], []
    step = engine.step

    def recording_step():
        outputs = step()
        finished.extend(o for o in outputs if o.finished)
        unfinished.extend(o for o in outputs if not o.finished)
        return outputs

    engine.step = recording_step
    device_s = 0.02
    runner = IdleRunner(token_id=7, device_s=device_s)
    times = decode_step_times(engine, runner, batch=4, steps=5, final_only=final_only)
    # Each step waited for a device step; with async scheduling the next one starts
    # within the step before, so a step's own span can be short of device_s by the
    # host's part (well under a millisecond at batch 4), never by half of it.
    assert len(times) == 5 and min(times) >= device_s / 2
    assert len(finished) == 4
    assert all(o.token_ids == [7] * 9 and o.finish_reason == "length" for o in finished)
    # Outputs a step, or (final_only) the finished ones alone.
    assert len(unfinished) == (0 if final_only else 4 * 8)
    assert len({o.text for o in finished}) == 1 and finished[0].text
