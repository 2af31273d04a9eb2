"""base.py: what every parser shares. The content around calls keeps a plain answer
exactly as written and drops only the whitespace that separates text from calls; only
a format whose markers are special tokens keeps special tokens in the text."""

from __future__ import annotations

from hetero_infer.server.serving.tool_parsers import TOOL_PARSERS
from hetero_infer.server.serving.tool_parsers.base import ContentText


def test_a_plain_answer_is_kept_as_written():
    content = ContentText()
    pieces = [content.add(text) for text in ["  Hello", " there ", "\n"]]
    assert "".join(pieces) + content.finish() == "  Hello there \n"


def test_whitespace_around_calls_is_dropped():
    content = ContentText()
    assert content.add("Let me look. ") == "Let me look."
    content.call_starts()
    content.call_ends()
    assert content.add(" \n") == ""
    assert content.add(" Done.  ") == "Done."
    assert content.finish() == ""  # a call was made: the trailing whitespace goes


def test_only_formats_with_special_token_markers_keep_special_tokens():
    """Mistral's [TOOL_CALLS] is a special token; the others' markers are text (or,
    for Llama 3's <|python_tag|>, read the same when decoding drops it)."""
    keeps = {name: parser.keeps_special_tokens for name, parser in TOOL_PARSERS.items()}
    assert keeps == {"hermes": False, "llama3_json": False, "mistral": True, "pythonic": False}
