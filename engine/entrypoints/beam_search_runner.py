"""Runs a BeamSearch (engine/entrypoints/beam_search.py) through an engine: each round's beams
become requests for one token with their candidates' logprobs, through LLMEngine's
generate (the offline API, every prompt's search in step, so their rounds share
batches) or AsyncEngine's generate (the server's routes, one prompt per search).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from hetero_infer.engine.entrypoints.beam_search import BeamSearch, BeamSearchParams
from hetero_infer.engine.entrypoints.outputs import RequestMetrics, RequestOutput
from hetero_infer.engine.settings.exceptions import ValidationError

if TYPE_CHECKING:
    from hetero_infer.engine.frontend.input_processor import EngineRequest
    from hetero_infer.engine.params.sampling_params import SamplingParams
    from hetero_infer.engine.tokenizer.tokenizer import Tokenizer


# What the searches ask of the engines they run through (LLMEngine and AsyncEngine,
# which call them: this module imports neither).
class OfflineEngine(Protocol):
    tokenizer: Tokenizer
    max_model_len: int

    def generate(
        self, prompts: list[list[int]], sampling_params: list[SamplingParams], use_tqdm: bool = ...
    ) -> list[RequestOutput]: ...


class ServingEngine(Protocol):
    @property
    def tokenizer(self) -> Tokenizer: ...

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]: ...


def beam_search(
    engine: OfflineEngine, prompts: list[list[int]], params: BeamSearchParams
) -> list[list[RequestOutput]]:
    """Search each prompt (token ids); each one's outputs, best first. The searches run
    in step: a round's requests of every prompt share the engine's batches."""
    started = time.monotonic()
    eos = engine.tokenizer.eos_token_ids
    searches = []
    for prompt in prompts:
        room = engine.max_model_len - len(prompt)
        if room < 1:
            raise ValidationError(
                f"prompt: {len(prompt)} tokens leave no room in max_model_len "
                f"({engine.max_model_len})",
                param="prompt",
            )
        fitted = dataclasses.replace(params, max_tokens=min(params.max_tokens, room))
        searches.append(BeamSearch(prompt, fitted, eos))
    while live := [search for search in searches if not search.done]:
        batch = [(search, tokens) for search in live for tokens in search.prompts()]
        round_params = [search.round_params() for search, _ in batch]
        finals = engine.generate([t for _, t in batch], round_params, use_tqdm=False)
        for search in live:
            mine = [out for (owner, _), out in zip(batch, finals, strict=True) if owner is search]
            _advance(search, mine)
    metrics = RequestMetrics(arrival_time=started, finished_time=time.monotonic())
    return [
        search.outputs(f"beam-{i}", None, engine.tokenizer, metrics)
        for i, search in enumerate(searches)
    ]


async def beam_search_async(
    engine: ServingEngine, request: EngineRequest, params: BeamSearchParams
) -> list[RequestOutput]:
    """Search one checked request's prompt (its priority and time limit apply to every
    round; its own params are not read); its outputs, best first. Errors as
    AsyncEngine.generate raises them; cancelling it aborts the round's requests."""
    started = time.monotonic()
    search = BeamSearch(request.prompt_token_ids, params, engine.tokenizer.eos_token_ids)
    round_params = search.round_params()
    first_token_time = None
    round_index = 0
    while not search.done:
        beam_requests = [
            dataclasses.replace(
                request,
                request_id=f"{request.request_id}-beam{round_index}.{i}",
                prompt=None,
                prompt_token_ids=tokens,
                params=round_params,
                grammar=None,
            )
            for i, tokens in enumerate(search.prompts())
        ]
        runs = [asyncio.ensure_future(_final_output(engine, r)) for r in beam_requests]
        try:
            finals = await asyncio.gather(*runs)
        except BaseException:
            for run in runs:
                run.cancel()  # unwinds into AsyncEngine.generate, which aborts it
            raise
        _advance(search, finals)
        first_token_time = first_token_time or time.monotonic()
        round_index += 1
    metrics = RequestMetrics(
        arrival_time=started, first_token_time=first_token_time, finished_time=time.monotonic()
    )
    return search.outputs(request.request_id, request.prompt, engine.tokenizer, metrics)


def _advance(search: BeamSearch, finals: list[RequestOutput]) -> None:
    """A round's outputs into the search. A round ended by the request's time limit
    ends the search with the beams it has, "length" as the engine ends a request cut
    short (none before the first token: the search has no answer); a failed step ends
    it with "error"."""
    if any(o.finish_reason == "error" for o in finals):
        search.cut_short("error")
    elif any(o.finish_reason == "abort" or not o.logprobs for o in finals):
        search.cut_short("length")
    else:
        search.advance([out.logprobs[0] for out in finals])  # type: ignore[index]


async def _final_output(engine: ServingEngine, request: EngineRequest) -> RequestOutput:
    final = None
    async for output in engine.generate(request):
        final = output
    assert final is not None and final.finished
    return final
