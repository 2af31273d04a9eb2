"""llama3_json: Llama 3.1/3.2's JSON calls, ``{"name": ..., "parameters": {...}}``,
optionally after ``<|python_tag|>``, several separated by ``;``.

The answer is calls only when it opens with one (an object whose first key is
"name"); anything else is a plain answer. ``<|python_tag|>`` is a special token, so
decoding usually drops it; the text is read the same with or without it.
"""

from __future__ import annotations

import json

from hetero_infer.server.serving.tool_parsers.base import (
    Call,
    ParsedText,
    StateMachineToolParser,
)
from hetero_infer.server.serving.tool_parsers.json_call import JsonCall

PYTHON_TAG = "<|python_tag|>"
_NAME_KEY = '"name"'


def opens_call(text: str) -> bool | None:
    """Whether ``text`` (whitespace stripped) opens a call object: None while too
    short to tell."""
    if not text:
        return None
    if text[0] != "{":
        return False
    rest = text[1:].lstrip()
    if len(rest) < len(_NAME_KEY):
        return None if _NAME_KEY.startswith(rest) else False
    return rest.startswith(_NAME_KEY)


class Llama3JsonToolParser(StateMachineToolParser):
    name = "llama3_json"

    @classmethod
    def write_calls(cls, calls: list[Call]) -> str:
        return "; ".join(
            json.dumps({"name": name, "parameters": arguments}) for name, arguments in calls
        )

    def __init__(self) -> None:
        # start -> call -> between -> (";") next -> call ...; any of them -> content
        super().__init__("start")

    def finish(self) -> ParsedText:
        return self._finished(self._buffer if self._state in ("start", "content") else "")

    def _advance(self, out: ParsedText) -> bool:
        if self._state == "content":
            return self._pass_content(out)
        if self._state == "call":
            return self._feed_call(out, "between")
        stripped = self._buffer.lstrip()
        if self._state == "start":
            if len(stripped) < len(PYTHON_TAG) and PYTHON_TAG.startswith(stripped):
                return False
            if stripped.startswith(PYTHON_TAG):
                stripped = stripped[len(PYTHON_TAG) :].lstrip()
        elif self._state == "between":
            if not stripped:
                return False
            if stripped[0] != ";":
                self._state = "content"  # text after the calls
                return True
            self._buffer = stripped[1:]
            self._state = "next"
            return True
        # start or next: a call, or (at the start) a plain answer
        opens = opens_call(stripped)
        if opens is None:
            return False
        if opens:
            if self._state == "start":
                self.content.call_starts()
            self._call = JsonCall(self)
            self._buffer = stripped
            self._state = "call"
        else:
            self._state = "content"
        return True
