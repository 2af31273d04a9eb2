"""Speculative decoding's counters, as vLLM exports them (vllm:spec_decode_*)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    # 0: speculation is off (nothing is exported then).
    num_speculative_tokens: int = 0
    num_drafts: int = 0  # verified drafts (sequences with draft tokens, per step)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Per draft position: how often the draft token there was accepted.
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_drafted:
            self.accepted_per_position += [0] * (num_drafted - len(self.accepted_per_position))
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0
