"""Property: for any text, however it is cut into deltas, each parser's pieces add up
to what the whole text gives (so a stream never shows what the whole answer does
not). Texts are drawn from the formats' own fragments, so they hit every state."""

from __future__ import annotations

import random

from hetero_infer.server.serving.reasoning import (
    REASONING_PARSERS,
    ReasoningDelta,
    reasoning_parser,
)
from hetero_infer.server.serving.tool_parsers import TOOL_PARSERS
from hetero_infer.server.serving.tool_parsers.constrained import RequiredToolCallsParser
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.server.serving.tool_parsers.streaming import random_pieces, run

FRAGMENTS = [
    "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<think>", "</think>",
    "{", "}", "[", "]", "(", ")", '"name"', '"arguments"', '"parameters"', '"f"', ":", ",",
    ";", "=", "a", "1", " ", "\n", '"', '\\"', "'", "None", "<",
]  # fmt: skip

texts = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)
PARSERS = [*TOOL_PARSERS.values(), RequiredToolCallsParser]


@settings(max_examples=150, deadline=None)
@given(text=texts, seed=st.integers(0, 2**32 - 1))
def test_tool_parsers(text: str, seed: int) -> None:
    rng = random.Random(seed)
    for parser in PARSERS:
        whole = run(parser(), [text])
        assert run(parser(), random_pieces(text, rng)) == whole, parser.name
        assert run(parser(), list(text)) == whole, parser.name


@settings(max_examples=150, deadline=None)
@given(text=texts, seed=st.integers(0, 2**32 - 1))
def test_reasoning_parsers(text: str, seed: int) -> None:
    rng = random.Random(seed)
    for name in REASONING_PARSERS:
        results = []
        for pieces in ([text], list(text), random_pieces(text, rng)):
            parser, out = reasoning_parser(name), ReasoningDelta()
            for delta in [*(parser.feed(p) for p in pieces), parser.finish()]:
                out.reasoning += delta.reasoning
                out.content += delta.content
            results.append(out)
        assert results[0] == results[1] == results[2], name
