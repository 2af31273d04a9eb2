"""mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` after any text.

``[TOOL_CALLS]`` is a special token in Mistral's tokenizers, so requests parsed this
way keep special tokens in their text (as vLLM does for this parser)."""

from __future__ import annotations

import json

from hetero_infer.server.serving.tool_parsers.base import (
    Call,
    ParsedText,
    ToolParser,
    split_at_marker,
)
from hetero_infer.server.serving.tool_parsers.json_call import JsonCallArray

MARKER = "[TOOL_CALLS]"


class MistralToolParser(ToolParser):
    name = "mistral"
    keeps_special_tokens = True

    @classmethod
    def write_calls(cls, calls: list[Call]) -> str:
        items = [{"name": name, "arguments": arguments} for name, arguments in calls]
        return MARKER + json.dumps(items)

    def __init__(self) -> None:
        super().__init__()
        self._buffer = ""
        self._calls: JsonCallArray | None = None  # set while inside an array of calls

    def feed(self, text: str) -> ParsedText:
        self._buffer += text
        out = ParsedText()
        while True:
            if self._calls is None:
                before, found, self._buffer = split_at_marker(self._buffer, MARKER)
                out.content += self.content.add(before)
                if not found:
                    return out
                self.content.call_starts()
                self._calls = JsonCallArray(self)
            deltas, rest = self._calls.feed(self._buffer)
            out.tool_calls += deltas
            self._buffer = rest or ""
            if rest is None:
                return out
            if self._calls.failed:  # no array after the marker: it was text
                out.content += self.content.add(MARKER)
            else:
                self.content.call_ends()
            self._calls = None

    def finish(self) -> ParsedText:
        out = ParsedText()
        if self._calls is None:
            out.content += self.content.add(self._buffer)
        self._buffer = ""
        out.content += self.content.finish()
        return out
