"""Every stream's lines stay whole for clients that split them with str.splitlines
(httpx's aiter_lines among them): a model's U+0085, U+2028 or U+2029 goes escaped."""

from __future__ import annotations

import json

import pytest
from hetero_infer.server.anthropic.messages_stream import _event as anthropic_event
from hetero_infer.server.json_line import json_line
from hetero_infer.server.ollama.ndjson import _line as ollama_line
from hetero_infer.server.openai.responses import _event as openai_event
from hetero_infer.server.openai.responses_api_stream import _encode as responses_event

TEXT = "a\x85b\u2028c\u2029d\n\u00e9"  # the three, a newline and a character kept as is
BODY = {"type": "response.output_text.delta", "delta": TEXT}


def test_json_line_escapes_what_splitlines_ends_a_line_at():
    line = json_line(BODY)
    assert line.splitlines() == [line]
    assert "\u00e9" in line  # UTF-8 kept, not \\u escapes for all
    assert json.loads(line) == BODY


@pytest.mark.parametrize(
    "encoded",
    [
        anthropic_event("content_block_delta", BODY),
        ollama_line(BODY),
        openai_event(BODY),
        responses_event(BODY),
    ],
    ids=["anthropic", "ollama", "openai", "responses"],
)
def test_each_stream_sends_its_data_on_one_line(encoded):
    lines = [line for line in encoded.decode().splitlines() if line]
    data = [line.removeprefix("data: ") for line in lines if not line.startswith("event: ")]
    assert [json.loads(d) for d in data] == [BODY]
