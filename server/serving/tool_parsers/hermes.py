"""hermes: calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any
number of them, with text around them (Hermes, Qwen2.5, Qwen3 and their templates)."""

from __future__ import annotations

import json

from hetero_infer.server.serving.tool_parsers.base import (
    Call,
    ParsedText,
    StateMachineToolParser,
    split_at_marker,
)
from hetero_infer.server.serving.tool_parsers.json_call import JsonCall

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"


class HermesToolParser(StateMachineToolParser):
    name = "hermes"

    @classmethod
    def write_calls(cls, calls: list[Call]) -> str:
        return "\n".join(
            f"{CALL_START}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CALL_END}"
            for name, arguments in calls
        )

    def __init__(self) -> None:
        super().__init__("content")  # content -> opened -> call -> closing -> content

    def finish(self) -> ParsedText:
        # In content: a held-back marker start that never completed.
        return self._finished(self._buffer if self._state == "content" else "")

    def _advance(self, out: ParsedText) -> bool:
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
            return self._feed_call(out, "closing")
        # closing: the end marker is optional (a model may leave it out).
        stripped = self._buffer.lstrip()
        if len(stripped) < len(CALL_END) and CALL_END.startswith(stripped):
            return False
        if stripped.startswith(CALL_END):
            stripped = stripped[len(CALL_END) :]
        self._buffer = stripped
        self._state = "content"
        return True
