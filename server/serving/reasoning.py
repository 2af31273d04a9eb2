"""Reasoning parsers, by the names vLLM's ``--reasoning-parser`` takes: the text a
model writes inside ``<think>...</think>`` becomes ``reasoning_content``, the rest
``content``.

``deepseek_r1``: DeepSeek-R1's template opens the thinking in the prompt, so the
output may start inside it without an opening tag. ``qwen3``: thinking only where the
output opens with ``<think>`` (with ``chat_template_kwargs: {"enable_thinking":
false}`` the template writes an empty one in the prompt and the output is all content).
Like the tool parsers, each decides only on text it has seen and holds back a tag's
possible start, so streamed pieces add up to the whole answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero_infer.engine.params.thinking_budget import Encoder
from hetero_infer.server.serving.tool_parsers.base import split_at_marker

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class ThinkTagParser:
    """One choice's text split at ``<think>`` and ``</think>``."""

    def __init__(self, starts_in_reasoning: bool) -> None:
        self._starts_in_reasoning = starts_in_reasoning
        self._buffer = ""
        self._state = "start"  # start -> reasoning -> after -> content

    def feed(self, text: str) -> ReasoningDelta:
        self._buffer += text
        out = ReasoningDelta()
        if self._state == "start":
            stripped = self._buffer.lstrip()
            if len(stripped) < len(THINK_START) and THINK_START.startswith(stripped):
                return out
            if stripped.startswith(THINK_START):
                self._buffer = stripped[len(THINK_START) :]
                self._state = "reasoning"
            else:
                self._state = "reasoning" if self._starts_in_reasoning else "content"
        if self._state == "reasoning":
            before, found, self._buffer = split_at_marker(self._buffer, THINK_END)
            out.reasoning += before
            if found:
                self._state = "after"
        if self._state == "after":
            # The blank line a model writes after </think> is not part of the answer.
            self._buffer = self._buffer.lstrip()
            if self._buffer:
                self._state = "content"
        if self._state == "content":
            out.content += self._buffer
            self._buffer = ""
        return out

    def finish(self) -> ReasoningDelta:
        """What was held back: reasoning where the thinking was not closed."""
        held, self._buffer = self._buffer, ""
        in_reasoning = self._state == "reasoning" or (
            self._state == "start" and self._starts_in_reasoning
        )
        return ReasoningDelta(reasoning=held) if in_reasoning else ReasoningDelta(content=held)


REASONING_PARSERS = {"deepseek_r1": True, "qwen3": False}  # name -> starts in reasoning


def end_mark_tokens(tokenizer: Encoder) -> list[int]:
    """The end mark as the tokens a model writes it in."""
    return tokenizer.encode(THINK_END, add_special_tokens=False)


class ThinkingTokens:
    """One choice's thinking in tokens, as its output arrives: those through the first
    end mark (``</think>`` as tokens), all of them while the thinking has not closed.
    They are thinking only where the parser found some (``reasoned``)."""

    def __init__(self, end_mark: list[int]) -> None:
        self.end_mark = end_mark
        self.through_end = 0
        self.closed = False
        self.reasoned = False
        self._tail: list[int] = []  # the last tokens, as long as the mark

    def add(self, token_ids: list[int]) -> None:
        for token in token_ids:
            if self.closed:
                return
            self.through_end += 1
            self._tail = [*self._tail, token][-len(self.end_mark) :]
            self.closed = self._tail == self.end_mark

    @property
    def count(self) -> int:
        return self.through_end if self.reasoned else 0


def reasoning_token_count(token_ids: list[int], end_mark: list[int], reasoned: bool) -> int:
    """How many of a whole output's tokens are its thinking (ThinkingTokens)."""
    thinking = ThinkingTokens(end_mark)
    thinking.add(token_ids)
    thinking.reasoned = reasoned
    return thinking.count


def reasoning_parser(name: str) -> ThinkTagParser:
    return ThinkTagParser(starts_in_reasoning=REASONING_PARSERS[name])
