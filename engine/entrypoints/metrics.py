"""Engine-wide counters: what the engine has done since it started."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hetero_infer.engine.core.engine_core import CoreCounters
from hetero_infer.engine.core.spec_decode_stats import SpecDecodeStats


@dataclass
class EngineMetrics(CoreCounters):
    """The core's counters (steps, tokens, preemptions, time limits), and the front
    end's."""

    started: float = field(default_factory=time.monotonic)
    requests_processed: int = 0  # finished, whatever the reason
    prompt_tokens: int = 0
    total_latency: float = 0.0
    spec_decode: SpecDecodeStats = field(default_factory=SpecDecodeStats)

    @property
    def average_latency(self) -> float:
        """Mean seconds from arrival to finish over finished requests."""
        return self.total_latency / self.requests_processed if self.requests_processed else 0.0

    @property
    def throughput(self) -> float:
        """Generated tokens per second of engine work."""
        return self.tokens_generated / self.busy_time if self.busy_time else 0.0

    # The Hetero-Paged-Infer seed's names for the same figures.
    @property
    def avg_latency_ms(self) -> float:
        return self.average_latency * 1000

    @property
    def throughput_tok_per_sec(self) -> float:
        return self.throughput

    def as_dict(self) -> dict[str, float]:
        return {
            "requests_processed": self.requests_processed,
            "prompt_tokens": self.prompt_tokens,
            "tokens_generated": self.tokens_generated,
            "num_steps": self.num_steps,
            "num_preemptions": self.num_preemptions,
            "num_timeouts": self.num_timeouts,
            "num_rejected": self.num_rejected,
            "average_latency": self.average_latency,
            "throughput": self.throughput,
            "max_batch_size": self.max_batch_size,
            "spec_decode_num_drafts": self.spec_decode.num_drafts,
            "spec_decode_num_draft_tokens": self.spec_decode.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.spec_decode.num_accepted_tokens,
            "spec_decode_acceptance_rate": self.spec_decode.acceptance_rate,
        }
