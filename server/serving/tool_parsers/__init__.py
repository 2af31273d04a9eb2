"""Tool-call parsers, by the names vLLM's ``--tool-call-parser`` takes.

Each reads one choice's text, whole or streamed, into content and tool calls
(base.py says how); constrained.py reads the output of a constrained tool_choice.
"""

from __future__ import annotations

from hetero_infer.server.serving.tool_parsers.base import (
    ParsedText,
    ToolCallDelta,
    ToolParser,
)
from hetero_infer.server.serving.tool_parsers.hermes import HermesToolParser
from hetero_infer.server.serving.tool_parsers.llama3_json import Llama3JsonToolParser
from hetero_infer.server.serving.tool_parsers.mistral import MistralToolParser
from hetero_infer.server.serving.tool_parsers.pythonic import PythonicToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser
    for parser in (
        HermesToolParser,
        Llama3JsonToolParser,
        MistralToolParser,
        PythonicToolParser,
    )
}

__all__ = ["TOOL_PARSERS", "ParsedText", "ToolCallDelta", "ToolParser"]
