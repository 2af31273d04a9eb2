"""Tool calls written as JSON, read as they arrive: one call object
``{"name": ..., "arguments": {...}}`` (JsonCall) and an array of them (JsonCallArray).

Several formats share these: hermes and llama3_json write single objects, mistral and
the constrained ``required`` tool_choice write arrays. The arguments go out as the
model wrote them (their raw JSON text) while they grow, so a client sees them in
pieces; the call's name goes out first, as soon as its string is complete.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetero_infer.server.serving.tool_parsers.base import ToolCallDelta, ToolParser

# llama3_json and vLLM's required-choice schema say "parameters"; the others "arguments".
ARGUMENT_KEYS = ("arguments", "parameters")
_WHITESPACE = " \t\r\n"


class JsonCall:
    """One JSON call object, fed from its opening ``{``.

    A small scanner follows strings and nesting: at the top level it reads keys, the
    name's string, and where the arguments' value starts and ends, so it never needs
    the whole object to parse. A call whose name is missing or not a string makes no
    call at all (nothing of it has gone out before its name).
    """

    def __init__(self, parser: ToolParser) -> None:
        self._parser = parser
        self.text = ""
        self.end: int | None = None  # past the closing brace, once complete
        self.name: str | None = None
        self._started = False
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._string_start = 0
        self._key: str | None = None
        self._expect_value = False
        self._value_start: int | None = None
        self._args_start: int | None = None  # where the arguments' value starts
        self._args_end: int | None = None
        self._args_sent = 0  # how far the arguments' text has gone out
        self._sent_no_arguments = False

    def feed(self, text: str) -> tuple[list[ToolCallDelta], str | None]:
        """The call's pieces that the new text completes, and the text after the
        object once it has ended (None while it goes on)."""
        start = len(self.text)
        self.text += text
        for i in range(start, len(self.text)):
            self._scan(i)
            if self.end is not None:
                break
        rest = None
        if self.end is not None:
            rest = self.text[self.end :]
            self.text = self.text[: self.end]
        return self._emit(), rest

    def _scan(self, i: int) -> None:
        c = self.text[i]
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif c == "\\":
                self._escaped = True
            elif c == '"':
                self._in_string = False
                if self._depth == 1:
                    self._top_level_string(self._string_start, i + 1)
            return
        if c in _WHITESPACE:
            return
        if self._depth == 1:
            if c == ":":
                self._expect_value = True
                return
            if c in ",}":
                self._end_value(i)
                self._key, self._expect_value, self._value_start = None, False, None
                if c == "}":
                    self._depth = 0
                    self.end = i + 1
                return
            if self._expect_value and self._value_start is None:
                self._value_start = i
                if self._key in ARGUMENT_KEYS and self._args_start is None:
                    self._args_start = self._args_sent = i
        if c == '"':
            self._in_string = True
            self._string_start = i
        elif c in "{[":
            self._depth += 1
        elif c in "}]":
            self._depth -= 1
            if self._depth == 1:
                self._end_value(i + 1)

    def _top_level_string(self, start: int, end: int) -> None:
        try:
            value = json.loads(self.text[start:end])
        except ValueError:
            value = None
        if not self._expect_value:
            self._key = value
        elif self._key == "name" and self.name is None and self._value_start == start:
            self.name = value
        if self._expect_value:
            self._end_value(end)

    def _end_value(self, end: int) -> None:
        """The top-level value being read ends before ``end`` (a scalar's end is found
        at the comma or brace after it, hence the strip)."""
        start = self._args_start
        if start is not None and self._args_end is None and self._value_start == start:
            self._args_end = start + len(self.text[start:end].rstrip())

    def _emit(self) -> list[ToolCallDelta]:
        if not self._started:
            if self.name is None:
                return []
            self._started = True
            deltas = [self._parser.start_call(self.name)]
        else:
            deltas = []
        arguments = self._new_arguments()
        if arguments:
            if deltas:
                deltas[0].arguments = arguments
            else:
                deltas.append(self._parser.more_arguments(arguments))
        return deltas

    def _new_arguments(self) -> str:
        start = self._args_start
        if start is None:
            # A call without arguments takes none: "{}" once the object is complete.
            if self.end is None or self._sent_no_arguments:
                return ""
            self._sent_no_arguments = True
            return "{}"
        if self.text[start] == "{":
            # An object streams as it is written.
            upto = self._args_end if self._args_end is not None else len(self.text)
            new = self.text[self._args_sent : upto]
            self._args_sent = upto
            return new
        if self._args_end is None or self._args_sent >= self._args_end:
            return ""
        # Anything else goes out once complete: a string holding JSON as its text, a
        # scalar as it is.
        raw = self.text[start : self._args_end]
        self._args_sent = self._args_end
        if self.text[start] == '"':
            try:
                decoded = json.loads(raw)
            except ValueError:
                return raw
            return decoded if isinstance(decoded, str) else raw
        return raw


class JsonCallArray:
    """A JSON array of call objects, fed from its opening ``[`` (or what should be).

    ``failed`` says the text did not open an array (or an item was not an object):
    the text from there on is for the caller to treat as content.
    """

    def __init__(self, parser: ToolParser) -> None:
        self._parser = parser
        self._state = "open"  # open -> item -> call -> next -> item ... -> done
        self._call: JsonCall | None = None
        self._buffer = ""
        self.failed = False

    def feed(self, text: str) -> tuple[list[ToolCallDelta], str | None]:
        """The calls' pieces, and the text after the array once it has ended or
        failed (None while it goes on)."""
        self._buffer += text
        deltas: list[ToolCallDelta] = []
        while True:
            if self._state == "call":
                assert self._call is not None
                new, rest = self._call.feed(self._buffer)
                deltas += new
                self._buffer = rest or ""
                if rest is None:
                    return deltas, None
                self._state = "next"
                continue
            stripped = self._buffer.lstrip()
            if not stripped:
                return deltas, None
            expected = {"open": "[", "item": "{]", "next": ",]"}[self._state]
            c = stripped[0]
            if c not in expected:
                self.failed = self._state == "open"
                self._buffer = ""
                return deltas, stripped
            if c == "]":
                self._buffer = ""
                return deltas, stripped[1:]
            if c == "{":
                self._call = JsonCall(self._parser)
                self._state = "call"
                self._buffer = stripped
            else:  # "[" or ","
                self._state = "item"
                self._buffer = stripped[1:]
