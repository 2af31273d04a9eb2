"""InferenceEngine: the Hetero-Paged-Infer seed's API over LLMEngine.

    engine = InferenceEngine(EngineConfig(max_batch_size=32))
    request_id = engine.submit_request("Hello", GenerationParams(max_tokens=100))
    for result in engine.run():
        print(result.request_id, result.output_text)

The seed's Rust names, in Python: request ids are integers, a finished request is a
``CompletedRequest``, ``memory_stats()`` gives the seed's ``MemoryStats``, and
``engine.metrics`` its counters (requests_processed, tokens_generated,
avg_latency_ms, throughput_tok_per_sec). A tokenizer is pluggable: any object with
``encode(text)`` and ``decode(ids)`` (the seed's TokenizerTrait).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from hetero_infer.engine.entrypoints.llm_engine import LLMEngine
from hetero_infer.engine.entrypoints.metrics import EngineMetrics
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.params.sampling_params import SamplingParams
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import ValidationError

# The seed's documented range for temperature (0 here means greedy).
MAX_TEMPERATURE = 2.0


@dataclass
class GenerationParams:
    """The seed's GenerationParams, with its documented defaults."""

    max_tokens: int = 100
    temperature: float = 1.0
    top_p: float = 0.9

    def validate(self) -> None:
        """ValidationError (a ValueError) naming the field that is out of range."""
        temperature = self.temperature
        if isinstance(temperature, int | float) and temperature > MAX_TEMPERATURE:
            raise ValidationError(
                f"temperature must be in [0, 2], got {temperature!r}", param="temperature"
            )
        self.to_sampling_params()  # the rest as SamplingParams checks them

    def is_valid(self) -> bool:
        try:
            self.validate()
        except ValidationError:
            return False
        return True

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p
        )


@dataclass(frozen=True)
class CompletedRequest:
    """A finished request, as the seed's ``run()`` and ``step()`` return it."""

    request_id: int
    input_text: str
    output_text: str
    input_tokens: int  # how many prompt tokens
    output_tokens: list[int]  # the generated token ids
    finish_reason: str | None  # "stop", "length", "abort" or "error"
    duration: float  # seconds from submission to finish
    success: bool
    error: str | None = None

    @property
    def generated_tokens(self) -> int:
        return len(self.output_tokens)


@dataclass(frozen=True)
class MemoryStats:
    """KV cache blocks, as the seed counts them."""

    total_blocks: int
    used_blocks: int
    free_blocks: int
    num_sequences: int

    def utilization(self) -> float:
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0


class InferenceEngine:
    def __init__(self, config: EngineConfig | None = None, tokenizer: Any = None) -> None:
        self._engine = LLMEngine(config, tokenizer=tokenizer)
        self._ids = itertools.count(1)
        self._texts: dict[str, str] = {}  # our request id -> the submitted text

    @property
    def config(self) -> EngineConfig:
        return self._engine.config

    @property
    def metrics(self) -> EngineMetrics:
        return self._engine.metrics

    def get_metrics(self) -> EngineMetrics:
        return self._engine.metrics

    def submit_request(self, text: str, params: GenerationParams | None = None) -> int:
        """Queue a prompt; returns its request id. ValidationError for bad input."""
        params = params or GenerationParams()
        params.validate()
        if not isinstance(text, str):
            raise ValidationError("prompt must be a string", param="prompt")
        request_id = next(self._ids)
        self._engine.add_request(text, params.to_sampling_params(), str(request_id))
        self._texts[str(request_id)] = text
        return request_id

    def has_pending_work(self) -> bool:
        return self._engine.has_pending_work()

    def step(self) -> list[CompletedRequest]:
        """One scheduling step; the requests it finished."""
        return [self._completed(out) for out in self._engine.step() if out.finished]

    def run(self) -> list[CompletedRequest]:
        """Step until every submitted request is finished; all of them, in finish order."""
        completed: list[CompletedRequest] = []
        while self.has_pending_work():
            completed += self.step()
        return completed

    def cancel_request(self, request_id: int) -> bool:
        """Abort a request; False if it is not running."""
        return self._engine.abort(str(request_id))

    def memory_stats(self) -> MemoryStats:
        stats = self._engine.memory_stats()
        return MemoryStats(
            total_blocks=stats["total_blocks"],
            used_blocks=stats["used_blocks"],
            free_blocks=stats["free_blocks"],
            num_sequences=stats["num_sequences"],
        )

    # The seed's other names for the same.
    get_memory_stats = memory_stats

    def memory_utilization(self) -> float:
        return self.memory_stats().utilization()

    def _completed(self, out: RequestOutput) -> CompletedRequest:
        text = self._texts.pop(out.request_id, "")
        failed = out.finish_reason == "error"
        return CompletedRequest(
            request_id=int(out.request_id),
            input_text=text,
            output_text=out.text,
            input_tokens=len(out.prompt_token_ids),
            output_tokens=list(out.token_ids),
            finish_reason=out.finish_reason,
            duration=out.metrics.latency or 0.0,
            success=not failed,
            error="the request failed" if failed else None,
        )
