"""llama3_json: Llama 3.1/3.2's JSON calls, ``{"name": ..., "parameters": {...}}``,
optionally after ``<|python_tag|>``, several separated by ``;``.

The answer is calls only when it opens with one (an object whose first key is
"name"); anything else is a plain answer. ``<|python_tag|>`` is a special token, so
decoding usually drops it; the text is read the same with or without it.
"""

from __future__ import annotations

from hetero_infer.server.openai.tool_parsers.base import ParsedText, ToolParser
from hetero_infer.server.openai.tool_parsers.json_call import JsonCall

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


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def __init__(self) -> None:
        super().__init__()
        self._buffer = ""
        # start -> call -> between -> (";") next -> call ...; any of them -> content
        self._state = "start"
        self._call: JsonCall | None = None

    def feed(self, text: str) -> ParsedText:
        self._buffer += text
        out = ParsedText()
        while self._advance(out):
            pass
        return out

    def finish(self) -> ParsedText:
        out = ParsedText()
        if self._state in ("start", "content"):
            out.content += self.content.add(self._buffer)
        self._buffer = ""
        out.content += self.content.finish()
        return out

    def _advance(self, out: ParsedText) -> bool:
        if self._state == "content":
            out.content += self.content.add(self._buffer)
            self._buffer = ""
            return False
        if self._state == "call":
            assert self._call is not None
            deltas, rest = self._call.feed(self._buffer)
            out.tool_calls += deltas
            self._buffer = rest or ""
            if rest is None:
                return False
            self.content.call_ends()
            self._state = "between"
            return True
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
