"""ThinkingBudget: vLLM's thinking_token_budget, the most tokens a request may think.

A thinking section opens with the start mark (``<think>``, in the prompt where the
chat template opens it, or in the output) and closes with the end mark. Once a section
holds ``tokens`` tokens, the sampler is made to write the end mark, token by token, so
the answer comes next instead of more thinking. The state is read from the tokens
themselves each step, so preemption, recomputation and restarts need nothing kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hetero_infer.engine.settings.exceptions import ValidationError


class Encoder(Protocol):
    """What writes the marks as tokens: the engine's Tokenizer (a layer above params)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class ThinkingBudget:
    tokens: int
    start: tuple[int, ...]  # the start mark's tokens
    end: tuple[int, ...]  # the end mark's tokens

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 0:
            raise ValidationError(
                f"thinking_token_budget must be an integer >= 0, got {self.tokens!r}",
                param="thinking_token_budget",
            )
        if not self.start or not self.end:
            raise ValidationError(
                "thinking_token_budget needs the thinking marks' tokens",
                param="thinking_token_budget",
            )

    @classmethod
    def for_marks(cls, tokens: int, start: str, end: str, tokenizer: Encoder) -> ThinkingBudget:
        """The budget for the thinking marks ``start`` and ``end`` (the reasoning
        parser's), as ``tokenizer`` writes them within a text."""
        return cls(
            tokens,
            tuple(tokenizer.encode(start, add_special_tokens=False)),
            tuple(tokenizer.encode(end, add_special_tokens=False)),
        )

    def forced_token(self, token_ids: list[int]) -> int | None:
        """The token the next step must take (the end mark's next one) where the
        newest thinking section of ``token_ids`` (prompt then output) has spent the
        budget and is not closed yet; None otherwise."""
        opened = _after_last(token_ids, self.start)
        if opened is None:
            return None
        thought = token_ids[opened:]
        if _contains(thought, self.end) or len(thought) < self.tokens:
            return None
        # The part of the end mark already written (by the model or by earlier steps).
        written = next(
            (k for k in range(len(self.end) - 1, 0, -1) if thought[-k:] == list(self.end[:k])),
            0,
        )
        return self.end[written]


def _after_last(token_ids: list[int], mark: tuple[int, ...]) -> int | None:
    """The index just past the last occurrence of ``mark`` in ``token_ids``, or None."""
    first, n = mark[0], len(mark)
    for i in range(len(token_ids) - n, -1, -1):
        if token_ids[i] == first and tuple(token_ids[i : i + n]) == mark:
            return i + n
    return None


def _contains(token_ids: list[int], mark: tuple[int, ...]) -> bool:
    return _after_last(token_ids, mark) is not None
