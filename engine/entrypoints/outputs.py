"""RequestOutput: what a caller sees of a request after each step and at the end.

Each is a snapshot the engine never changes once made: a step makes new ones, so a
caller (or another thread) may keep them while the engine goes on. They are plain
dataclasses, not frozen ones, as vLLM's are: a frozen dataclass sets each field through
object.__setattr__, which a step making one per sequence pays for.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hetero_infer.engine.core.step_data import Logprobs
from hetero_infer.engine.params.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    # FINAL_ONLY outputs, which the server sees only at the end: (seconds since the
    # previous token-bearing step, tokens it brought) for each step after the first.
    token_gaps: tuple[tuple[float, int], ...] = ()

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time


@dataclass
class RequestOutput:
    """With RequestOutputKind.DELTA, ``text``, ``token_ids`` and ``logprobs`` are the
    step's only (as ``delta_text`` and ``delta_token_ids``)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finished: bool
    # "stop" (eos), "length" (max_tokens or max_model_len), "abort", "error"; None while running.
    finish_reason: str | None
    # The sum of the output tokens' logprobs; None unless the request asked for logprobs
    # (as in vLLM: they are computed only for the rows that ask).
    cumulative_logprob: float | None
    metrics: RequestMetrics
    # What this step added, for streaming.
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    # The stop_token_ids entry or stop string that ended it (vLLM's stop_reason).
    stop_reason: int | str | None = None
    # When asked: per output token {token_id: logprob} (the token's own, then its top
    # alternatives); per prompt token the same, None for the first.
    logprobs: list[Logprobs] | None = None
    prompt_logprobs: list[Logprobs | None] | None = None
    # n > 1: this output is choice ``index`` of the request ``group_id`` (the id the
    # caller gave); request_id is the choice's own. For n = 1 they are 0 and request_id.
    index: int = 0
    group_id: str = ""
    # An embedding request's pooled, unit-length vector, on its finished output.
    embedding: list[float] | None = None
    # The prompt tokens the prefix cache gave it (its KV found, not computed), as vLLM's
    # num_cached_tokens: 0 until it is first scheduled.
    num_cached_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.group_id:
            self.group_id = self.request_id


# mini-infer's name for the same.
GenerateOutput = RequestOutput


def final_only(params: list[SamplingParams]) -> list[SamplingParams]:
    """``params`` with each one's outputs FINAL_ONLY (one copy per distinct one), for
    callers that read only the finished output: the engine then makes no output a step
    (a cumulative one copies the text and tokens so far: at 256 sequences a fifth of the
    host's step)."""
    final = {id(p): replace(p, output_kind=RequestOutputKind.FINAL_ONLY) for p in params}
    return [final[id(p)] for p in params]
