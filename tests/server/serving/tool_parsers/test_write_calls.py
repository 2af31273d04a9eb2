"""Property: what each parser writes for a list of calls (write_calls, used by prompts
that show the model the format) it reads back as those calls, however it streams."""

from __future__ import annotations

import json
import keyword
import random

import pytest
from hetero_infer.server.serving.tool_parsers import TOOL_PARSERS
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.server.serving.tool_parsers.streaming import random_pieces, run

# Identifiers, as function and parameter names are (pythonic's calls cannot name a
# keyword argument after a Python keyword).
names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True).filter(
    lambda name: not keyword.iskeyword(name)
)
scalars = st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=12)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3)
)
calls = st.lists(
    st.tuples(names, st.dictionaries(names, values, max_size=4)), min_size=1, max_size=3
)


@pytest.mark.parametrize("parser", TOOL_PARSERS.values(), ids=list(TOOL_PARSERS))
@settings(max_examples=100, deadline=None)
@given(written=calls, seed=st.integers(0, 2**32 - 1))
def test_a_parser_reads_what_it_writes(parser, written, seed):
    text = parser.write_calls(written)
    for pieces in ([text], random_pieces(text, random.Random(seed))):
        content, read = run(parser(), pieces)
        assert content == ""
        assert [(name, json.loads(arguments)) for name, arguments in read] == written
