"""server/serving/request_context.py without a server: the model name a 404 echoes, and
run_to_end's answer to finished choices: a 408 only where none of them has a token (a
time limit that ended them all before their first), else each one in choice order."""

from __future__ import annotations

import asyncio
import time

import pytest
from hetero_infer.engine.entrypoints.outputs import RequestMetrics, RequestOutput
from hetero_infer.engine.frontend.input_processor import EngineRequest
from hetero_infer.engine.params.sampling_params import SamplingParams
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.server.errors import APIError
from hetero_infer.server.server_metrics import ServerMetrics
from hetero_infer.server.serving.request_context import (
    MAX_ECHOED_NAME,
    RequestContext,
    check_model,
    echoed,
)
from hetero_infer.server.settings import ServerSettings


def test_echoed_names_are_cut_past_the_limit():
    name = "m" * MAX_ECHOED_NAME
    assert echoed(name) == name
    assert echoed(name + "x") == name + "..."


def test_check_model():
    settings = ServerSettings(engine=EngineConfig(), served_model_name="served")
    check_model(settings, None)  # any
    check_model(settings, "served")
    name = "other" * 100
    with pytest.raises(APIError) as info:
        check_model(settings, name)
    error = info.value
    assert error.status_code == 404 and error.code == "model_not_found"
    assert error.message == f"The model `{name[:MAX_ECHOED_NAME]}...` does not exist."


def finished(request_id: str, reason: str, tokens: list[int], index: int = 0) -> RequestOutput:
    metrics = RequestMetrics(arrival_time=time.monotonic())
    text = "x" * len(tokens)
    return RequestOutput(
        request_id, None, [1], text, tokens, True, reason, None, metrics, index=index
    )


class ScriptedEngine:
    """Each request's outputs as the test scripts them: the engine's side of run_to_end."""

    def __init__(self, outputs: dict[str, list[RequestOutput]]) -> None:
        self.outputs = outputs

    async def generate(self, request: EngineRequest):
        for output in self.outputs[request.request_id]:
            yield output


class StayingClient:
    """An HTTP connection whose client never goes away."""

    async def receive(self) -> dict:
        await asyncio.Event().wait()
        return {}


def run_to_end(outputs: dict[str, list[RequestOutput]]) -> list[list[RequestOutput]]:
    settings = ServerSettings(engine=EngineConfig())
    ctx = RequestContext(ScriptedEngine(outputs), ServerMetrics(), "m", StayingClient(), settings)
    params = SamplingParams(max_tokens=4)
    requests = [EngineRequest(request_id, None, [1], params) for request_id in outputs]
    return asyncio.run(ctx.run_to_end(requests))


def test_out_of_time_before_any_token_is_a_408():
    with pytest.raises(APIError) as info:
        run_to_end({"a": [finished("a", "abort", [])], "b": [finished("b", "abort", [])]})
    assert info.value.status_code == 408 and info.value.code == "request_timeout"


@pytest.mark.parametrize(
    "outputs",
    [
        # A prompt that never started beside one that had tokens when the time was up.
        {"a": [finished("a", "length", [5, 6])], "b": [finished("b", "abort", [])]},
        {"a": [finished("a", "abort", [5])]},  # aborted with a token: an answer
    ],
)
def test_an_answer_with_any_token_is_given(outputs):
    finals = run_to_end(outputs)
    assert [[o.finish_reason for o in f] for f in finals] == [
        [o.finish_reason for o in outs] for outs in outputs.values()
    ]


def test_choices_come_in_choice_order():
    outputs = [finished("a-1", "stop", [7], index=1), finished("a-0", "stop", [8], index=0)]
    running = RequestOutput("a-0", None, [1], "", [], False, None, None, outputs[0].metrics)
    [finals] = run_to_end({"a": [running, *outputs]})
    assert [o.index for o in finals] == [0, 1]
