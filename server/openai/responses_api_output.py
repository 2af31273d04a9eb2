"""OutputItems: a response's output items as its text is parsed, and the stream events
that build them, in the order OpenAI documents.

The chat route's parser (chat_output.py) splits the generated text into reasoning,
content and tool calls; each kind becomes an output item (``reasoning``, ``message``,
``function_call``). An item opens when its first piece arrives and closes when another
kind of piece (or the end) comes:

    response.output_item.added
      response.content_part.added                (message, reasoning)
      response.output_text.delta ...             (reasoning: reasoning_text.delta)
      response.output_text.done
      response.content_part.done
      -- or, for a call: response.function_call_arguments.delta ... / .done
    response.output_item.done

A whole answer is the stream of one delta (its events unused), so both give the same
items. Events carry no ``sequence_number``: the stream numbers them as they go out.
"""

from __future__ import annotations

import uuid
from typing import Any

from hetero_infer.server.serving.chat_output import MessageDelta
from hetero_infer.server.serving.tool_parsers import ToolCallDelta

Event = dict[str, Any]


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_part(kind: str, text: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class OutputItems:
    """One response's output items, built from its parsed text."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._open_text = ""  # the open message's or reasoning's text so far
        self._call_index: int | None = None  # the parser's index of the open call

    def feed(self, delta: MessageDelta) -> list[Event]:
        """The events of the next parsed piece."""
        events: list[Event] = []
        if delta.reasoning:
            events += self._text("reasoning", delta.reasoning)
        if delta.content:
            events += self._text("message", delta.content)
        for call in delta.tool_calls:
            events += self._call(call)
        return events

    def finish(self, status: str) -> list[Event]:
        """The events that close the last item, ``status`` being the response's
        ("completed", "incomplete", or "failed": its last item is then incomplete). An
        answer with no output at all still has its (empty) message, as OpenAI's does."""
        events: list[Event] = []
        if not self.items:
            events += self._open_item("message")
        events += self._close("incomplete" if status == "failed" else status)
        return events

    # ---- text: message and reasoning ----

    def _text(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close("completed")
            events += self._open_item(kind)
        assert self._open is not None
        self._open_text += text
        prefix = "response.reasoning_text" if kind == "reasoning" else "response.output_text"
        event = self._item_event(f"{prefix}.delta", content_index=0, delta=text)
        if kind == "message":
            event["logprobs"] = []
        return [*events, event]

    def _open_item(self, kind: str) -> list[Event]:
        if kind == "message":
            item = {
                "id": item_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        else:
            item = {
                "id": item_id("rs"),
                "type": "reasoning",
                "status": "in_progress",
                "summary": [],
                "content": [],
            }
        self._open, self._open_text = item, ""
        self.items.append(item)
        return [
            self._added(),
            self._item_event(
                "response.content_part.added", content_index=0, part=_text_part(kind, "")
            ),
        ]

    # ---- function calls ----

    def _call(self, call: ToolCallDelta) -> list[Event]:
        events: list[Event] = []
        if call.id is not None:  # a call's first piece: a new item
            events += self._close("completed")
            item = {
                "id": item_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": item_id("call"),
                "name": call.name,
                "arguments": "",
            }
            self._open, self._call_index = item, call.index
            self.items.append(item)
            events.append(self._added())
        # Parsers finish one call before the next begins.
        assert self._open is not None and self._call_index == call.index
        if call.arguments:
            self._open["arguments"] += call.arguments
            events.append(
                self._item_event("response.function_call_arguments.delta", delta=call.arguments)
            )
        return events

    # ---- closing ----

    def _close(self, status: str) -> list[Event]:
        item = self._open
        if item is None:
            return []
        events: list[Event] = []
        if item["type"] == "function_call":
            events.append(
                self._item_event(
                    "response.function_call_arguments.done",
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        else:
            kind = item["type"]
            part = _text_part(kind, self._open_text)
            item["content"] = [part]
            if kind == "reasoning":
                done = self._item_event(
                    "response.reasoning_text.done", content_index=0, text=self._open_text
                )
            else:
                done = self._item_event(
                    "response.output_text.done", content_index=0, text=self._open_text, logprobs=[]
                )
            events.append(done)
            events.append(
                self._item_event("response.content_part.done", content_index=0, part=part)
            )
        item["status"] = status
        events.append(
            {
                "type": "response.output_item.done",
                "output_index": len(self.items) - 1,
                "item": dict(item),
            }
        )
        self._open, self._open_text, self._call_index = None, "", None
        return events

    def _added(self) -> Event:
        assert self._open is not None
        return {
            "type": "response.output_item.added",
            "output_index": len(self.items) - 1,
            "item": dict(self._open),
        }

    def _item_event(self, event_type: str, **fields: Any) -> Event:
        """An event about the open item (always the last one)."""
        assert self._open is not None
        return {
            "type": event_type,
            "item_id": self._open["id"],
            "output_index": len(self.items) - 1,
            **fields,
        }
