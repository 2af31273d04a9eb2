"""tool_use.py: what a request's tools and tool_choice make of its answer."""

from __future__ import annotations

from typing import Any

import pytest
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.chat_plan import ChatPlan
from hetero_infer.server.serving.tool_parsers.constrained import NamedToolCallParser
from hetero_infer.server.serving.tool_parsers.mistral import MistralToolParser
from hetero_infer.server.serving.tool_use import NO_PARAMETERS, tool_use
from hetero_infer.server.settings import ServerSettings

PARAMETERS = {"type": "object", "properties": {"x": {"type": "integer"}}}
TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": PARAMETERS}},
    {"type": "function", "function": {"name": "g"}},
]


def body(**fields: Any) -> ChatPlan:
    return ChatPlan(messages=[{"role": "user", "content": "hi"}], **fields)


def test_required_is_an_array_of_calls_each_with_its_functions_parameters():
    use = tool_use(body(tools=TOOLS, tool_choice="required"), ServerSettings())
    schema = use.json_schema
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    alternatives = schema["items"]["anyOf"]
    assert [a["properties"]["name"] for a in alternatives] == [{"const": "f"}, {"const": "g"}]
    assert [a["properties"]["parameters"] for a in alternatives] == [PARAMETERS, NO_PARAMETERS]
    assert all(a["required"] == ["name", "parameters"] for a in alternatives)
    one = tool_use(
        body(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), ServerSettings()
    )
    assert one.json_schema["maxItems"] == 1
    assert use.template_tools == TOOLS and use.max_calls is None
    assert not use.keeps_special_tokens  # JSON, decoded as text


def test_named_is_that_functions_arguments():
    choice = {"type": "function", "function": {"name": "g"}}
    use = tool_use(body(tools=TOOLS, tool_choice=choice), ServerSettings())
    assert use.json_schema == NO_PARAMETERS
    parser = use.new_parser()
    assert isinstance(parser, NamedToolCallParser) and parser.function_name == "g"
    assert not use.keeps_special_tokens


def test_auto_reads_with_the_servers_parser():
    settings = ServerSettings(enable_auto_tool_choice=True, tool_call_parser="mistral")
    use = tool_use(body(tools=TOOLS, parallel_tool_calls=False), settings)  # auto by default
    assert use.json_schema is None and use.new_parser is MistralToolParser
    assert use.keeps_special_tokens and use.max_calls == 1


def test_none_shows_the_tools_and_reads_no_calls():
    use = tool_use(body(tools=TOOLS, tool_choice="none"), ServerSettings())
    assert use.template_tools == TOOLS and use.new_parser is None and use.json_schema is None


def test_auto_needs_the_flag():
    with pytest.raises(APIError, match="--enable-auto-tool-choice") as error:
        tool_use(body(tools=TOOLS), ServerSettings())
    assert error.value.param == "tool_choice"


def test_function_names_are_unique():
    twice = [*TOOLS, {"type": "function", "function": {"name": "f"}}]
    with pytest.raises(APIError, match="unique") as error:
        tool_use(body(tools=twice, tool_choice="none"), ServerSettings())
    assert error.value.param == "tools"
    assert tool_use(body(tools=TOOLS, tool_choice="none"), ServerSettings()).template_tools
