"""AsyncEngine.load: the engine is built in the thread that runs its steps, so that
one OpenMP pool serves all of its parallel work (see AsyncEngine.load)."""

from __future__ import annotations

import asyncio
import threading

from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.async_engine import AsyncEngine

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
