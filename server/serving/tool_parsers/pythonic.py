"""pythonic: calls as a Python list, ``[get_weather(city="Paris"), get_time()]``
(Llama 3.2 and 4's own format). The answer is calls only when it opens with such a
list; each call is read with Python's ``ast`` and takes keyword arguments whose values
are literals (strings, numbers, booleans, None, lists, dicts), nothing evaluated.

A call goes out whole once its closing parenthesis arrives: Python's literals are
not JSON, so its arguments cannot stream as written. A call that does not parse
ends the calls: the text from it on (all of it, when no call went out) is content.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from hetero_infer.server.serving.tool_parsers.base import (
    Call,
    ParsedText,
    StateMachineToolParser,
)

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_BRACKETS = {"(": ")", "[": "]", "{": "}"}


def opens_call_list(text: str) -> bool | None:
    """Whether ``text`` opens a list of calls, ``[name(``: None while too short to tell."""
    text = text.lstrip()
    if not text:
        return None
    if text[0] != "[":
        return False
    rest = text[1:].lstrip()
    if not rest:
        return None
    name = _IDENTIFIER.match(rest)
    if name is None:
        return False
    rest = rest[name.end() :].lstrip()
    return None if not rest else rest[0] == "("


def call_length(text: str) -> int | None:
    """How long the call at the start of ``text`` is, through its closing parenthesis;
    None while incomplete, -1 if brackets or strings go wrong before it closes."""
    stack: list[str] = []
    quote = ""
    escaped = False
    for i, c in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in _BRACKETS:
            stack.append(_BRACKETS[c])
        elif c in ")]}":
            if not stack or stack.pop() != c:
                return -1
            if not stack:
                return i + 1 if c == ")" else -1
        elif not stack and c in ",]":
            return -1
    return None


def parse_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """(name, arguments) of ``name(key=literal, ...)``; None for anything else."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        arguments = {}
        for keyword in node.keywords:
            if keyword.arg is None:  # **kwargs
                return None
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        json.dumps(arguments, allow_nan=False)  # sets, bytes, complex, inf: not JSON
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None
    return node.func.id, arguments


class PythonicToolParser(StateMachineToolParser):
    name = "pythonic"

    @classmethod
    def write_calls(cls, calls: list[Call]) -> str:
        # Python's literals for JSON's values: repr writes True, None, quoted strings.
        written = (
            f"{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"
            for name, arguments in calls
        )
        return f"[{', '.join(written)}]"

    def __init__(self) -> None:
        super().__init__("start")  # start -> call -> next -> call ... -> content
        self._unsent = ""  # all the text so far, while none of it has gone out

    def feed(self, text: str) -> ParsedText:
        if self.num_calls == 0 and self._state != "content":
            self._unsent += text
        return super().feed(text)

    def finish(self) -> ParsedText:
        held = ""
        if self._state == "content":
            held = self._buffer
        elif self.num_calls == 0:
            held = self._unsent
        # (An unfinished call after complete ones is cut off: the output was.)
        self._unsent = ""
        return self._finished(held)

    def _advance(self, out: ParsedText) -> bool:
        if self._state == "content":
            return self._pass_content(out)
        stripped = self._buffer.lstrip()
        if self._state == "start":
            opens = opens_call_list(stripped)
            if opens is None:
                return False
            if not opens:
                self._to_content(self._buffer)
                return True
            self._buffer = stripped[1:]
            self._state = "call"
            return True
        if not stripped:
            return False
        if stripped[0] == "]" or (self._state == "next" and stripped[0] != ","):
            # The list ends (or is left): what follows is content.
            self.content.call_ends()
            self._to_content(stripped[1:] if stripped[0] == "]" else stripped)
            return True
        if self._state == "next":
            self._buffer = stripped[1:]
            self._state = "call"
            return True
        length = call_length(stripped)
        if length is None:
            return False
        parsed = parse_call(stripped[:length]) if length > 0 else None
        if parsed is None:
            self._to_content(stripped)
            return True
        name, arguments = parsed
        if self.num_calls == 0:
            self.content.call_starts()
        out.tool_calls.append(self.start_call(name, json.dumps(arguments, ensure_ascii=False)))
        self._buffer = stripped[length:]
        self._state = "next"
        return True

    def _to_content(self, text: str) -> None:
        """The rest is content: all the text so far when none of it went out."""
        self._buffer = self._unsent if self.num_calls == 0 else text
        self._state = "content"
