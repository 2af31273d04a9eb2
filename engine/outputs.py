"""RequestOutput: what a caller sees of a request after each step and at the end."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0

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
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finished: bool
    # "stop" (eos), "length" (max_tokens or max_model_len), "abort", "error"; None while running.
    finish_reason: str | None
    cumulative_logprob: float
    metrics: RequestMetrics
    # What this step added, for streaming.
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    error: str | None = None
    # The stop_token_ids entry or stop string that ended it (vLLM's stop_reason).
    stop_reason: int | str | None = None
    # When asked: per output token {token_id: logprob} (the token's own, then its top
    # alternatives); per prompt token the same, None for the first.
    logprobs: list[dict[int, float]] | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None
    # n > 1: this output is choice ``index`` of the request ``group_id`` (the id the
    # caller gave); request_id is the choice's own. For n = 1 they are 0 and request_id.
    index: int = 0
    group_id: str = ""

    def __post_init__(self) -> None:
        self.group_id = self.group_id or self.request_id


# mini-infer's name for the same.
GenerateOutput = RequestOutput
