"""A forced tool's schema with local ``$defs`` / ``$ref``s: tool_choice required (one
schema for all the tools, each nested in it) moves each tool's schema to the root's
``$defs`` under a name of its own and makes its pointers start there, so its refs
resolve, and two tools' ``$defs`` of the same name stay apart. The calls made follow
the tool's own schema, on /v1/chat/completions and /v1/messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import llguidance
import pytest
from hetero_infer.server.serving.tool_definitions import FunctionDefinition
from hetero_infer.server.serving.tool_use import required_calls_schema

from tests.server.conftest import LiveServer
from tests.server.test_abuse_routes import CHAT, MESSAGES, chat, check_still_serving, messages, send

# Both name their definition "p": a string in one, an integer in the other.
NAMED = {
    "type": "object",
    "$defs": {
        "p": {"type": "string", "maxLength": 3},
        "pair": {
            "type": "object",
            "properties": {"first": {"$ref": "#/$defs/p"}, "second": {"$ref": "#/$defs/p"}},
            "required": ["first", "second"],
            "additionalProperties": False,
        },
    },
    "properties": {"name": {"$ref": "#/$defs/p"}, "pair": {"$ref": "#/$defs/pair"}},
    "required": ["name", "pair"],
    "additionalProperties": False,
}
COUNTED = {
    "type": "object",
    "definitions": {"p": {"type": "integer", "minimum": 0, "maximum": 99}},
    "properties": {"count": {"$ref": "#/definitions/p"}, "again": {"$ref": "#/properties/count"}},
    "required": ["count", "again"],
    "additionalProperties": False,
}
SCHEMAS = {"named": NAMED, "counted": COUNTED}
ROOM = 160  # tokens: enough for either call whole


def functions() -> list[FunctionDefinition]:
    return [FunctionDefinition(name=name, parameters=schema) for name, schema in SCHEMAS.items()]


def test_each_tools_refs_resolve_to_its_own_definitions():
    schema = required_calls_schema(functions(), parallel=True)
    good = [
        {"name": "named", "parameters": {"name": "ab", "pair": {"first": "x", "second": "y"}}},
        {"name": "counted", "parameters": {"count": 3, "again": 4}},
    ]
    jsonschema.validate(good, schema)
    # Each "p" is its own tool's: a string in one, an integer in the other.
    for wrong in (
        {"name": "named", "parameters": {"name": 1, "pair": {"first": "x", "second": "y"}}},
        {"name": "counted", "parameters": {"count": "3", "again": 4}},
        {"name": "counted", "parameters": {"count": 3, "again": "4"}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([wrong], schema)
    # The functions' own schemas are left as they were.
    assert NAMED["properties"]["name"] == {"$ref": "#/$defs/p"}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""


def test_a_ref_to_the_tools_root_is_to_its_own_schema():
    tree = {
        "type": "object",
        "properties": {"label": {"type": "string"}, "child": {"$ref": "#"}},
        "required": ["label"],
    }
    schema = required_calls_schema(
        [FunctionDefinition(name="tree", parameters=tree), *functions()], parallel=True
    )
    nested = {"label": "a", "child": {"label": "b", "child": {"label": "c"}}}
    jsonschema.validate([{"name": "tree", "parameters": nested}], schema)
    with pytest.raises(jsonschema.ValidationError):  # the child is a tree too
        jsonschema.validate(
            [{"name": "tree", "parameters": {"label": "a", "child": {"label": 1}}}], schema
        )


def test_refs_in_every_kind_of_subschema_move_and_data_stays():
    """Pointers under items, anyOf, patternProperties and properties start at the
    tool's new place; a const, enum, default or example that looks like a $ref is data."""
    data = {"$ref": "#/$defs/p"}
    parameters = {
        "$defs": {"p": {"type": "integer"}},
        "type": "object",
        "properties": {
            "one": {"$ref": "#/$defs/p"},
            "many": {"type": "array", "items": {"$ref": "#/$defs/p"}},
            "either": {"anyOf": [{"$ref": "#/$defs/p"}, {"type": "null"}]},
            "keyed": {"type": "object", "patternProperties": {"^x": {"$ref": "#/$defs/p"}}},
            "fixed": {"const": data, "enum": [data], "default": {"x": data}, "examples": [data]},
        },
    }
    schema = required_calls_schema([FunctionDefinition(name="f", parameters=parameters)], True)
    moved = schema["$defs"]["tool_0"]["properties"]
    rebased = {"$ref": "#/$defs/tool_0/$defs/p"}
    assert moved["one"] == moved["many"]["items"] == moved["either"]["anyOf"][0] == rebased
    assert moved["keyed"]["patternProperties"]["^x"] == rebased
    assert moved["fixed"] == parameters["properties"]["fixed"]


def test_tools_without_refs_stay_inline():
    plain = {"type": "object", "properties": {"x": {"type": "integer"}}}
    schema = required_calls_schema([FunctionDefinition(name="f", parameters=plain)], True)
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == plain
    assert "$defs" not in schema


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def chat_tools() -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": name, "parameters": schema}}
        for name, schema in SCHEMAS.items()
    ]


def sampled(**fields: Any) -> dict[str, Any]:
    """Several seeded samples, so that more than one call path is taken (with the tiny
    model, seed 2 calls both tools)."""
    return {"temperature": 1.0, "seed": 2, **fields}


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "named"}}],
    ids=["required", "named"],
)
def test_chat_calls_follow_the_tools_schema(
    http: httpx.Client, server: LiveServer, tool_choice: Any
):
    body = chat(tools=chat_tools(), tool_choice=tool_choice, max_tokens=ROOM, n=4, **sampled())
    response = send(http, CHAT, body)
    assert response.status_code == 200, response.text[:1000]
    calls = [
        call
        for choice in response.json()["choices"]
        if choice["finish_reason"] == "tool_calls"
        for call in choice["message"]["tool_calls"]
    ]
    assert calls, response.text[:1000]
    for call in calls:
        name = call["function"]["name"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
    check_still_serving(http, server, CHAT)


@pytest.mark.parametrize(
    "tool_choice", [{"type": "any"}, {"type": "tool", "name": "counted"}], ids=["any", "tool"]
)
def test_messages_tool_use_follows_the_tools_schema(
    http: httpx.Client, server: LiveServer, tool_choice: dict[str, Any]
):
    tools = [{"name": name, "input_schema": schema} for name, schema in SCHEMAS.items()]
    # One call, which ROOM holds whole: the tiny model, sampled, may go on calling.
    choice = {**tool_choice, "disable_parallel_tool_use": True}
    body = messages(tools=tools, tool_choice=choice, max_tokens=ROOM)
    response = send(http, MESSAGES, body)
    assert response.status_code == 200, response.text[:1000]
    answer = response.json()
    assert answer["stop_reason"] == "tool_use", answer
    uses = [block for block in answer["content"] if block["type"] == "tool_use"]
    assert uses, answer
    for use in uses:
        jsonschema.validate(use["input"], SCHEMAS[use["name"]])
    check_still_serving(http, server, MESSAGES)
