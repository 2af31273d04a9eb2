"""AsyncEngine.load: the engine is built in the thread that runs its steps, so that
one OpenMP pool serves all of its parallel work (see AsyncEngine.load)."""

from __future__ import annotations

import asyncio
import threading

from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.entrypoints.async_engine import AsyncEngine

from tests.tiny_models import save_tiny_model


def test_load_builds_the_engine_in_the_thread_that_steps_it(tmp_path, monkeypatch):
    threads: dict[str, set[int]] = {"init": set(), "step": set()}
    init, step = LLMEngine.__init__, LLMEngine.step

    def recording_init(self, *args, **kwargs):
        threads["init"].add(threading.get_ident())
        init(self, *args, **kwargs)

    def recording_step(self):
        threads["step"].add(threading.get_ident())
        return step(self)

    monkeypatch.setattr(LLMEngine, "__init__", recording_init)
    monkeypatch.setattr(LLMEngine, "step", recording_step)
    config = EngineConfig(
        model=str(save_tiny_model("llama", tmp_path)), max_model_len=128, max_num_blocks=32
    )

    async def main() -> list[int]:
        engine = await AsyncEngine.load(config)
        engine.start()
        request = engine.input_processor.process("r", [5, 6, 7], SamplingParams(max_tokens=4))
        tokens = [out.token_ids async for out in engine.generate(request)][-1]
        await engine.stop()
        return tokens

    assert len(asyncio.run(main())) == 4
    assert len(threads["init"]) == 1 and threads["step"] == threads["init"]
    assert threads["init"] != {threading.get_ident()}


def test_a_request_cancelled_before_the_loop_takes_it_leaves_the_loop_alive(tmp_path):
    """A client that leaves between its request's arrival and the loop's next turn: its
    task's cancellation cancels the future it waits on before its abort is queued. The
    loop must drop the request, not die on the cancelled future (which it once did,
    failing every request after it with 503)."""
    config = EngineConfig(
        model=str(save_tiny_model("llama", tmp_path)), max_model_len=128, max_num_blocks=32
    )
    engine = AsyncEngine(LLMEngine(config))

    def request(request_id: str):
        return engine.input_processor.process(request_id, [5, 6, 7], SamplingParams(max_tokens=4))

    async def consume(request_id: str) -> list:
        return [out async for out in engine.generate(request(request_id))]

    async def main() -> list:
        engine.start()
        await asyncio.sleep(0.1)  # the loop waits for work
        leaving = asyncio.create_task(consume("leaving"))
        # One turn: the request is queued and the loop woken; the loop's turn comes
        # before the cancelled task's own, so it sees the cancelled future first.
        await asyncio.sleep(0)
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        outputs = await consume("next")
        await engine.stop()
        return outputs

    outputs = asyncio.run(main())
    assert engine.dead_error is None
    assert outputs[-1].finished and len(outputs[-1].token_ids) == 4
    assert engine.num_pending == 0
