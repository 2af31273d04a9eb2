"""hermes: calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any
number of them, with text around them (Hermes, Qwen2.5, Qwen3 and their templates)."""

from __future__ import annotations

from hetero_infer.server.openai.tool_parsers.base import ParsedText, ToolParser, split_at_marker
from hetero_infer.server.openai.tool_parsers.json_call import JsonCall

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"

    def __init__(self) -> None:
        super().__init__()
        self._buffer = ""
        self._state = "content"  # content -> opened -> call -> closing -> content
        self._call: JsonCall | None = None

    def feed(self, text: str) -> ParsedText:
        self._buffer += text
        out = ParsedText()
        while self._advance(out):
            pass
        return out

    def finish(self) -> ParsedText:
        out = ParsedText()
        if self._state == "content":  # a held-back marker start that never completed
            out.content += self.content.add(self._buffer)
        self._buffer = ""
        out.content += self.content.finish()
        return out

    def _advance(self, out: ParsedText) -> bool:
        """One move of the state machine over the buffer; False when it needs more text."""
        if self._state == "content":
            before, found, self._buffer = split_at_marker(self._buffer, CALL_START)
            out.content += self.content.add(before)
            if found:
                self.content.call_starts()
                self._state = "opened"
            return found
        if self._state == "opened":
            stripped = self._buffer.lstrip()
            if not stripped:
                return False
            if stripped[0] != "{":
                # Not a call after all: the marker was text.
                out.content += self.content.add(CALL_START)
                self._state = "content"
                return True
            self._call = JsonCall(self)
            self._buffer = stripped
            self._state = "call"
            return True
        if self._state == "call":
            assert self._call is not None
            deltas, rest = self._call.feed(self._buffer)
            out.tool_calls += deltas
            self._buffer = rest or ""
            if rest is None:
                return False
            self.content.call_ends()
            self._state = "closing"
            return True
        # closing: the end marker is optional (a model may leave it out).
        stripped = self._buffer.lstrip()
        if len(stripped) < len(CALL_END) and CALL_END.startswith(stripped):
            return False
        if stripped.startswith(CALL_END):
            stripped = stripped[len(CALL_END) :]
        self._buffer = stripped
        self._state = "content"
        return True
