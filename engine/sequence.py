"""Sequence: one request's tokens, KV blocks and place in the state machine.

waiting -> running (prefill, possibly in chunks, then decode) -> finished
(stopped, length, aborted, failed); running -> waiting on recompute preemption,
running -> swapped -> running on swap preemption.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from hetero_infer.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_FAILED = "error"

    @property
    def is_finished(self) -> bool:
        return self.name.startswith("FINISHED")

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's finish_reason for a finished status ("stop", "length", "abort", "error")."""
        return self.value if self.is_finished else None


@dataclass
class SequenceTimes:
    arrival: float = field(default_factory=time.monotonic)
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.request_id = request_id
        # n > 1: every choice is a Sequence; group_id is the caller's request id and
        # index the choice's place. Choice 0 carries the others until its prompt is
        # computed, then they fork from it (see Scheduler.postprocess).
        self.group_id = request_id
        self.index = 0
        self.fork_children: list[Sequence] = []
        self.prompt = prompt
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        self.status = SequenceStatus.WAITING
        # Tokens whose KV is in the cache (or is being written this step).
        self.num_computed_tokens = 0
        # Physical KV block ids, in logical order (GPU blocks, or CPU blocks while swapped).
        self.block_table: list[int] = []
        # Prefix-cache bookkeeping: chained hashes of full token blocks, and how
        # many of this sequence's blocks are registered in the cache.
        self.block_hashes: list[int] = []
        self.num_registered_blocks = 0
        self.cumulative_logprob = 0.0
        self.output_text = ""
        self.times = SequenceTimes()
        self.num_preemptions = 0
        self.error: str | None = None
        # What stopped it, as vLLM reports: a stop_token_ids entry or a stop string
        # (None for eos, length, or while running).
        self.stop_reason: int | str | None = None
        # Per output token {token_id: logprob} for it and its top alternatives, when asked.
        self.logprobs: list[dict[int, float]] | None = (
            [] if sampling_params.logprobs is not None else None
        )
        # Per prompt token the same; the first token has none (nothing predicts it).
        self.prompt_logprobs: list[dict[int, float] | None] | None = (
            [None] if sampling_params.prompt_logprobs is not None else None
        )
        # response_format: an llguidance matcher fed every output token (the engine sets it).
        self.matcher: Any = None
        # Seeded requests draw from their own generator, so their tokens do not
        # depend on what else shares the batch.
        self.generator: torch.Generator | None = None
        if sampling_params.seed is not None:
            self.generator = torch.Generator().manual_seed(sampling_params.seed)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={len(self.token_ids)}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def append_token(
        self, token_id: int, logprob: float, top_logprobs: dict[int, float] | None = None
    ) -> None:
        self.token_ids.append(token_id)
        self.cumulative_logprob += logprob
        if self.logprobs is not None:
            self.logprobs.append(top_logprobs or {token_id: logprob})
