"""The output of a constrained tool_choice, read as calls whatever the server's parser.

With a named function the grammar makes the output that function's arguments, a JSON
object; with ``required`` it makes a JSON array of ``{"name", "parameters"}`` objects
(tool_use.py builds both schemas).
"""

from __future__ import annotations

from hetero_infer.server.serving.tool_parsers.base import ParsedText, ToolParser
from hetero_infer.server.serving.tool_parsers.json_call import JsonCallArray


class NamedToolCallParser(ToolParser):
    """The whole output is the arguments of one call to ``function_name``."""

    name = "named"

    def __init__(self, function_name: str) -> None:
        super().__init__()
        self.function_name = function_name

    def feed(self, text: str) -> ParsedText:
        if self.num_calls == 0:
            return ParsedText(tool_calls=[self.start_call(self.function_name, text)])
        return ParsedText(tool_calls=[self.more_arguments(text)] if text else [])

    def finish(self) -> ParsedText:
        return self.feed("") if self.num_calls == 0 else ParsedText()


class RequiredToolCallsParser(ToolParser):
    """The whole output is an array of calls."""

    name = "required"

    def __init__(self) -> None:
        super().__init__()
        self._calls = JsonCallArray(self)
        self._rest: str | None = None  # after the array (the grammar leaves nothing)

    def feed(self, text: str) -> ParsedText:
        if self._rest is not None:
            return ParsedText(content=self.content.add(text))
        deltas, self._rest = self._calls.feed(text)
        content = self.content.add(self._rest) if self._rest else ""
        return ParsedText(content, deltas)

    def finish(self) -> ParsedText:
        return ParsedText(content=self.content.finish())
