"""ChatOutputParser: one choice's generated text -> reasoning, content and tool calls,
as stream deltas or as the whole message; and their shapes in OpenAI's bodies.

The reasoning parser (when the server has one) goes first; the tool parser (when the
request's tool_choice asks for one) reads the content after the reasoning. The whole
message is the stream of one delta, so streamed and whole answers agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetero_infer.server.serving.reasoning import ThinkTagParser
from hetero_infer.server.serving.tool_parsers import ParsedText, ToolCallDelta, ToolParser


@dataclass
class MessageDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def add(self, other: MessageDelta) -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class ChatOutputParser:
    def __init__(
        self,
        reasoning: ThinkTagParser | None = None,
        tools: ToolParser | None = None,
        max_calls: int | None = None,
    ) -> None:
        self._reasoning = reasoning
        self._tools = tools
        # parallel_tool_calls: false with a parsed (not constrained) output keeps the first call.
        self._max_calls = max_calls

    @property
    def made_calls(self) -> bool:
        return self._tools is not None and self._tools.num_calls > 0

    def feed(self, text: str) -> MessageDelta:
        if self._reasoning is None:
            return self._content(text, final=False)
        split = self._reasoning.feed(text)
        out = MessageDelta(reasoning=split.reasoning)
        out.add(self._content(split.content, final=False))
        return out

    def finish(self) -> MessageDelta:
        out = MessageDelta()
        content = ""
        if self._reasoning is not None:
            held = self._reasoning.finish()
            out.reasoning, content = held.reasoning, held.content
        out.add(self._content(content, final=True))
        return out

    def parse(self, text: str) -> MessageDelta:
        """The whole message of a complete text."""
        out = self.feed(text)
        out.add(self.finish())
        return out

    def _content(self, text: str, final: bool) -> MessageDelta:
        if self._tools is None:
            return MessageDelta(content=text)
        parsed = self._tools.feed(text) if text else ParsedText()
        if final:
            parsed.add(self._tools.finish())
        calls = parsed.tool_calls
        if self._max_calls is not None:
            calls = [c for c in calls if c.index < self._max_calls]
        return MessageDelta(content=parsed.content, tool_calls=calls)


def tool_calls_body(deltas: list[ToolCallDelta]) -> list[dict[str, Any]]:
    """A whole message's ``tool_calls``: each call's pieces joined."""
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        if delta.index not in calls:
            calls[delta.index] = {
                "id": delta.id,
                "type": "function",
                "function": {"name": delta.name, "arguments": ""},
            }
        calls[delta.index]["function"]["arguments"] += delta.arguments
    return [calls[index] for index in sorted(calls)]


def tool_calls_delta(deltas: list[ToolCallDelta]) -> list[dict[str, Any]]:
    """A stream chunk's ``delta.tool_calls``, as OpenAI streams them: a call's first
    entry carries ``index``, ``id``, ``type`` and ``function.name``, later ones
    ``index`` and the next part of ``function.arguments``."""
    entries: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        entry = entries.get(delta.index)
        if entry is None:
            entry = {"index": delta.index}
            if delta.id is not None:
                entry.update(id=delta.id, type="function")
            entry["function"] = {"name": delta.name} if delta.name is not None else {}
            entry["function"]["arguments"] = ""
            entries[delta.index] = entry
        entry["function"]["arguments"] += delta.arguments
    return list(entries.values())
