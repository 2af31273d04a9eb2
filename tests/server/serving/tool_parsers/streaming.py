"""Running a tool parser over a text whole and in pieces, and what came out."""

from __future__ import annotations

import random
from collections.abc import Callable

from hetero_infer.server.serving.chat_output import tool_calls_body
from hetero_infer.server.serving.tool_parsers import ParsedText, ToolCallDelta, ToolParser

Call = tuple[str, str]  # (name, arguments)


def run(parser: ToolParser, pieces: list[str]) -> tuple[str, list[Call]]:
    """(content, calls) from feeding ``pieces`` one by one, then finishing."""
    out = ParsedText()
    for piece in pieces:
        out.add(parser.feed(piece))
    out.add(parser.finish())
    check_call_order(out.tool_calls)
    return out.content, [
        (c["function"]["name"], c["function"]["arguments"]) for c in tool_calls_body(out.tool_calls)
    ]


def check_call_order(deltas: list[ToolCallDelta]) -> None:
    """As OpenAI streams calls: numbered 0, 1, ... in order; each call's first piece
    (and only it) has an id and a name; every id is fresh."""
    seen: list[int] = []
    for delta in deltas:
        if delta.index not in seen:
            assert delta.index == len(seen), "calls numbered in order"
            assert delta.id and delta.id.startswith("chatcmpl-tool-") and delta.name is not None
            seen.append(delta.index)
        else:
            assert delta.index == seen[-1], "a call's pieces come together"
            assert delta.id is None and delta.name is None
    ids = [d.id for d in deltas if d.id]
    assert len(ids) == len(set(ids))


def random_pieces(text: str, rng: random.Random) -> list[str]:
    """``text`` cut at random places: often one character, sometimes longer runs."""
    pieces, i = [], 0
    while i < len(text):
        n = 1 if rng.random() < 0.4 else rng.randint(1, 12)
        pieces.append(text[i : i + n])
        i += n
    return pieces


def check_parse(
    new_parser: Callable[[], ToolParser],
    text: str,
    content: str,
    calls: list[Call],
    tries: int = 25,
) -> None:
    """``text`` whole gives ``content`` and ``calls``; fed a character at a time, and in
    random pieces, the deltas add up to the same."""
    assert run(new_parser(), [text]) == (content, calls)
    assert run(new_parser(), list(text)) == (content, calls)
    rng = random.Random(text)
    for _ in range(tries):
        assert run(new_parser(), random_pieces(text, rng)) == (content, calls)
