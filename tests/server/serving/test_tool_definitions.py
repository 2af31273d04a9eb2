"""server/serving/tool_definitions.py: which argument schemas a tool may have (a JSON
object's, as OpenAI's tools and Anthropic's input_schema take), and its name's length."""

from __future__ import annotations

import pytest
from hetero_infer.server.serving.tool_definitions import (
    FunctionDefinition,
    ToolDefinition,
    check_object_schema,
)

from tests.server.body_bounds import check_body


@pytest.mark.parametrize(
    "schema",
    [
        {},
        {"type": "object"},
        {"type": ["object", "null"]},
        {"properties": {"a": {"type": "string"}, "b": True}, "required": ["a"]},
    ],
)
def test_object_schemas_are_taken(schema: dict):
    assert check_object_schema(schema) is schema


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string"},
        {"type": ["string"]},
        {"type": ["string", "null"]},
        {"properties": ["a"]},
        {"properties": {"a": 1}},
        {"required": "a"},  # a string is a list of characters to a careless check
        {"required": [1]},
    ],
)
def test_other_schemas_are_refused(schema: dict):
    with pytest.raises(ValueError, match="must"):
        check_object_schema(schema)


@pytest.mark.parametrize(("length", "valid"), [(0, False), (1, True), (64, True), (65, False)])
def test_name_length(length: int, valid: bool):
    check_body(FunctionDefinition, {"name": "f" * length, "parameters": {}}, valid)


def test_a_template_gets_a_tool_without_the_fields_left_out():
    """As OpenAI's JSON, with no nulls for a template that writes a tool whole."""
    bare = {"type": "function", "function": {"name": "now"}}
    assert ToolDefinition.model_validate(bare).for_template() == bare
    full = {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Adds.",
            "parameters": {"type": "object"},
            "strict": False,
        },
    }
    assert ToolDefinition.model_validate(full).for_template() == full
