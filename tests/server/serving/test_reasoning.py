"""Reasoning parsers: <think>...</think> into reasoning_content, whole and streamed."""

from __future__ import annotations

import random

import pytest
from hetero_infer.server.serving.reasoning import (
    ReasoningDelta,
    ThinkingTokens,
    reasoning_parser,
    reasoning_token_count,
)

from tests.server.serving.tool_parsers.streaming import random_pieces


def split(name: str, pieces: list[str]) -> tuple[str, str]:
    parser = reasoning_parser(name)
    out = ReasoningDelta()
    for piece in [*pieces, None]:
        delta = parser.feed(piece) if piece is not None else parser.finish()
        out.reasoning += delta.reasoning
        out.content += delta.content
    return out.reasoning, out.content


@pytest.mark.parametrize(
    ("name", "text", "reasoning", "content"),
    [
        # DeepSeek-R1's template opens the thinking: the output starts inside it.
        ("deepseek_r1", "Two and two.\n</think>\n\nIt is 4.", "Two and two.\n", "It is 4."),
        ("deepseek_r1", "<think>Hm.</think>4", "Hm.", "4"),
        ("deepseek_r1", "Still thinking when cut off", "Still thinking when cut off", ""),
        ("deepseek_r1", "<thi", "<thi", ""),
        # Qwen3: thinking only between the tags, and only at the start.
        ("qwen3", "<think>\nPlan.\n</think>\n\nAnswer.", "\nPlan.\n", "Answer."),
        ("qwen3", "\n<think>a < b</think>ok", "a < b", "ok"),
        ("qwen3", "Answer without thinking.", "", "Answer without thinking."),
        ("qwen3", "Hi <think>x</think>", "", "Hi <think>x</think>"),
        ("qwen3", "<think>cut off </thi", "cut off </thi", ""),
        ("qwen3", "<thi", "", "<thi"),
    ],
)
def test_split(name: str, text: str, reasoning: str, content: str) -> None:
    assert split(name, [text]) == (reasoning, content)
    assert split(name, list(text)) == (reasoning, content)
    rng = random.Random(text)
    for _ in range(20):
        assert split(name, random_pieces(text, rng)) == (reasoning, content)


def test_tag_never_leaks_while_streaming() -> None:
    parser = reasoning_parser("qwen3")
    assert parser.feed("<th") == ReasoningDelta()
    assert parser.feed("ink>I think</th") == ReasoningDelta(reasoning="I think")
    assert parser.feed("ink>\n") == ReasoningDelta()
    assert parser.feed("Yes") == ReasoningDelta(content="Yes")


def test_text_that_cannot_open_a_tag_streams_at_once() -> None:
    """Held back is only what may still become <think>: a short answer is not."""
    parser = reasoning_parser("qwen3")
    assert parser.feed("Hi") == ReasoningDelta(content="Hi")
    parser = reasoning_parser("qwen3")
    assert parser.feed("<think>") == ReasoningDelta()
    assert parser.feed("a") == ReasoningDelta(reasoning="a")


@pytest.mark.parametrize(
    ("token_ids", "reasoned", "count"),
    [
        ([1, 2, 7, 8, 3, 4], True, 4),  # through the end mark (7, 8)
        ([7, 8, 3], True, 2),  # an empty thinking: the mark alone
        ([1, 2, 7, 3, 8], True, 5),  # the mark's tokens apart: never closed, all of it
        ([1, 2, 7, 8, 5, 7, 8], True, 4),  # the first mark ends it
        ([1, 2, 7, 8], False, 0),  # the parser found no thinking
        ([], True, 0),
    ],
)
def test_reasoning_tokens_are_those_through_the_end_mark(token_ids, reasoned, count):
    assert reasoning_token_count(token_ids, [7, 8], reasoned) == count


def test_thinking_counts_nothing_until_the_parser_finds_some():
    """As the chat route feeds it: tokens as they come, the parser's finding apart."""
    thinking = ThinkingTokens([7, 8])
    thinking.add([1, 7])
    thinking.add([8, 2])
    assert thinking.closed and thinking.count == 0
    thinking.reasoned |= True
    assert thinking.count == 3
