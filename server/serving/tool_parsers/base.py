"""What every tool-call parser shares: the pieces it returns, call ids, marker
hold-back, and the content that keeps the whitespace around calls out.

A parser is fed one choice's text as it is generated, a delta at a time, and says
which of it is content and which is tool calls. Each parser is one state machine that
decides only on text it has seen and holds back what the next text may still change
(the start of a marker, a call not yet complete), so however the text is cut into
deltas, the pieces it returns add up to the same answer: a whole answer is the stream
of a single delta.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from hetero_infer.engine.frontend.stop_strings import partial_match_length


@dataclass
class ToolCallDelta:
    """A piece of tool call number ``index``: its first piece carries the id and name,
    the others the next part of the arguments' JSON text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ParsedText:
    """What a piece of generated text turned out to be."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def add(self, other: ParsedText) -> None:
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)


def new_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def split_at_marker(text: str, marker: str) -> tuple[str, bool, str]:
    """(text before ``marker``, whether it was found, text after it). Not found, the
    tail that may be the marker's start is held back as the "after" part."""
    at = text.find(marker)
    if at != -1:
        return text[:at], True, text[at + len(marker) :]
    held = partial_match_length(text, [marker])
    return text[: len(text) - held], False, text[len(text) - held :]


class ContentText:
    """The text outside tool calls, as it streams. Whitespace that only separates text
    from calls is left out: trailing whitespace waits until more text follows (a call
    starting drops it), whitespace right after a call is dropped, and at the end
    trailing whitespace goes out only when no call was made (a plain answer stays
    exactly as the model wrote it)."""

    def __init__(self) -> None:
        self._pending = ""
        self._after_call = False
        self._made_calls = False

    def add(self, text: str) -> str:
        if self._after_call:
            text = text.lstrip()
            if not text:
                return ""
            self._after_call = False
        kept = text.rstrip()
        if not kept:
            self._pending += text
            return ""
        out = self._pending + kept
        self._pending = text[len(kept) :]
        return out

    def call_starts(self) -> None:
        self._pending = ""
        self._made_calls = True

    def call_ends(self) -> None:
        self._after_call = True

    def finish(self) -> str:
        out = "" if self._made_calls else self._pending
        self._pending = ""
        return out


# A call as a prompt writes it: the function's name and its arguments.
Call = tuple[str, dict[str, Any]]


class ToolParser(ABC):
    """One choice's text -> content and tool calls (see the module's docstring)."""

    name: ClassVar[str]
    # Whether the format's markers are special tokens, which decoding must then keep.
    keeps_special_tokens: ClassVar[bool] = False

    @classmethod
    def write_calls(cls, calls: list[Call]) -> str:
        """The calls as the model writes them in this format, which the parser reads
        back as those calls: for prompts that show the model the format (a template
        that renders no tools, server/serving/tool_prompt.py)."""
        raise TypeError(f"the {cls.name} parser reads calls it does not write")

    def __init__(self) -> None:
        self.num_calls = 0
        self.content = ContentText()

    @abstractmethod
    def feed(self, text: str) -> ParsedText:
        """What the next piece of generated text adds."""

    @abstractmethod
    def finish(self) -> ParsedText:
        """What was held back, once the text is complete."""

    def start_call(self, name: str, arguments: str = "") -> ToolCallDelta:
        """The first piece of the next call."""
        delta = ToolCallDelta(self.num_calls, new_tool_call_id(), name, arguments)
        self.num_calls += 1
        return delta

    def more_arguments(self, arguments: str) -> ToolCallDelta:
        """The next part of the latest call's arguments."""
        assert self.num_calls > 0, "arguments before any call"
        return ToolCallDelta(self.num_calls - 1, arguments=arguments)


class CallReader(Protocol):
    """A tool call being read as its text arrives (json_call.py's JsonCall, which makes
    its pieces with a ToolParser's start_call and more_arguments, and so imports this
    module)."""

    def feed(self, text: str) -> tuple[list[ToolCallDelta], str | None]:
        """The call's pieces the new text completes, and the text after the call once
        it has ended (None while it goes on)."""
        ...


class StateMachineToolParser(ToolParser):
    """A parser that keeps the text it has not decided on in ``_buffer`` and moves a
    state machine over it (``_advance``) until it needs more text."""

    def __init__(self, first_state: str) -> None:
        super().__init__()
        self._buffer = ""
        self._state = first_state
        self._call: CallReader | None = None

    def feed(self, text: str) -> ParsedText:
        self._buffer += text
        out = ParsedText()
        while self._advance(out):
            pass
        return out

    @abstractmethod
    def _advance(self, out: ParsedText) -> bool:
        """One move of the state machine over the buffer; False when it needs more text."""

    def _pass_content(self, out: ParsedText) -> bool:
        """Once the text is known to be plain content: all of the buffer goes out."""
        out.content += self.content.add(self._buffer)
        self._buffer = ""
        return False

    def _finished(self, held: str) -> ParsedText:
        """The end of the text: ``held`` (held-back text that turned out to be content,
        or "") and the content's own held whitespace."""
        out = ParsedText(content=self.content.add(held) if held else "")
        self._buffer = ""
        out.content += self.content.finish()
        return out

    def _feed_call(self, out: ParsedText, next_state: str) -> bool:
        """The buffer into the JSON call being read; once it is complete, on to
        ``next_state`` with what follows it."""
        assert self._call is not None
        deltas, rest = self._call.feed(self._buffer)
        out.tool_calls += deltas
        self._buffer = rest or ""
        if rest is None:
            return False
        self.content.call_ends()
        self._state = next_state
        return True
