"""What a chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` make of
its prompt, its grammar and the reading of its answer, decided once per request
(ToolUse), whichever family's body they came in (each names them as OpenAI does in the
ChatPlan it makes).

- ``none``: the tools are still shown to the template (as vLLM does); the answer is text.
- ``auto`` (the default with tools): the model decides; the server's
  ``--tool-call-parser`` reads its calls out of the text. Needs
  ``--enable-auto-tool-choice``, as in vLLM.
- ``required`` and a named function: the output is constrained by a JSON schema (the
  grammar of response_format), so the arguments always validate against the
  function's parameters; it becomes tool calls whatever the server's parser.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.chat_plan import ChatPlan
from hetero_infer.server.serving.tool_definitions import FunctionDefinition, NamedToolChoice
from hetero_infer.server.serving.tool_parsers import TOOL_PARSERS, ToolParser
from hetero_infer.server.serving.tool_parsers.constrained import (
    NamedToolCallParser,
    RequiredToolCallsParser,
)
from hetero_infer.server.settings import ServerSettings

# OpenAI: leaving out parameters defines a function that takes none.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
# JSON Schema keywords whose values are schemas: one, a list of them, or a map of them.
# (const, enum, default, examples hold data: a "$ref" there is no reference.)
_SCHEMA_KEYWORDS = frozenset(
    {
        "items", "additionalItems", "additionalProperties", "unevaluatedItems",
        "unevaluatedProperties", "contains", "propertyNames", "not", "if", "then", "else",
    }
)  # fmt: skip
_SCHEMA_LIST_KEYWORDS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
_SCHEMA_MAP_KEYWORDS = frozenset(
    {"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"}
)


@dataclass(frozen=True)
class ToolUse:
    """How tools shape one request: what the template sees, the output's schema
    (constrained choices), and how to read calls out of each choice's text."""

    template_tools: list[dict[str, Any]] | None = None
    json_schema: dict[str, Any] | None = None
    new_parser: Callable[[], ToolParser] | None = None
    # parallel_tool_calls: false keeps a parsed answer's first call only.
    max_calls: int | None = None
    # Whether the parser's markers are special tokens, which decoding must then keep.
    keeps_special_tokens: bool = False


def tool_use(body: ChatPlan, settings: ServerSettings) -> ToolUse:
    """The request's ToolUse; a 400 naming the field for what cannot be honoured."""
    if not body.tools:
        if body.tool_choice is not None:
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        return ToolUse()
    functions = [tool.function for tool in body.tools]
    names = [function.name for function in functions]
    if len(set(names)) < len(names):
        raise APIError(400, "tools: function names must be unique", param="tools")
    template_tools = [tool.for_template() for tool in body.tools]
    choice = body.tool_choice or "auto"
    if choice == "none":
        return ToolUse(template_tools)
    if choice == "auto":
        return _auto(body, settings, functions, template_tools)
    if body.structured_output() is not None or body.json_schema() is not None:
        field = body.constraint_param()
        raise APIError(
            400,
            f"'{field}' cannot be combined with tool_choice 'required' or a named "
            "function: both constrain the output",
            param=field,
        )
    if choice == "required":
        schema = required_calls_schema(functions, body.parallel_tool_calls is not False)
        return ToolUse(template_tools, schema, RequiredToolCallsParser)
    assert isinstance(choice, NamedToolChoice)
    named = [f for f in functions if f.name == choice.function.name]
    if not named:
        raise APIError(
            400,
            f"tool_choice names the function {choice.function.name!r}, which is not in tools",
            param="tool_choice",
        )
    name = named[0].name
    return ToolUse(template_tools, parameters_schema(named[0]), lambda: NamedToolCallParser(name))


def parameters_schema(function: FunctionDefinition) -> dict[str, Any]:
    return function.parameters if function.parameters is not None else NO_PARAMETERS


def required_calls_schema(functions: list[FunctionDefinition], parallel: bool) -> dict[str, Any]:
    """An array of one or more calls (one at most without parallel calls), each
    ``{"name": <a function's name>, "parameters": <its arguments>}``: one alternative
    per function, so each call's arguments follow its own function's schema."""
    calls = []
    hoisted: dict[str, Any] = {}
    for i, function in enumerate(functions):
        parameters = parameters_schema(function)
        if _has_local_refs(parameters):
            # Nested here, its "#..." pointers would no longer find what they name: the
            # schema moves to the root's $defs, under a name of its own, and its
            # pointers are made to start there (its $defs go with it).
            name = f"tool_{i}"
            hoisted[name] = _rebased(parameters, f"#/$defs/{name}")
            parameters = {"$ref": f"#/$defs/{name}"}
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": function.name}, "parameters": parameters},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    if hoisted:
        schema["$defs"] = hoisted
    return schema


def _subschemas(schema: dict[str, Any]) -> Iterator[Any]:
    """The schemas directly inside ``schema`` (not the data of const, enum...)."""
    for key, value in schema.items():
        if key in _SCHEMA_LIST_KEYWORDS and isinstance(value, list):
            yield from value
        elif key in _SCHEMA_MAP_KEYWORDS and isinstance(value, dict):
            yield from value.values()
        elif key in _SCHEMA_KEYWORDS:
            yield value


def _local_refs(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Each schema in ``schema`` (itself included) whose $ref points into the document
    ("#", "#/..."); iterative, as schemas nest deep."""
    stack: list[Any] = [schema]
    while stack:
        item = stack.pop()
        if not isinstance(item, dict):
            continue
        ref = item.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            yield item
        stack.extend(_subschemas(item))


def _has_local_refs(schema: dict[str, Any]) -> bool:
    return next(_local_refs(schema), None) is not None


def _rebased(schema: dict[str, Any], base: str) -> dict[str, Any]:
    """A copy of a function's schema to be kept at the pointer ``base``: each local
    $ref ("#/$defs/p", "#/properties/x", "#" for the schema itself) starts at
    ``base``. Its $id goes: a base URI of its own would change what the pointers mean."""
    schema = copy.deepcopy(schema)
    schema.pop("$id", None)
    schema.pop("$schema", None)
    for item in _local_refs(schema):
        item["$ref"] = base + item["$ref"][1:]
    return schema


def _auto(
    body: ChatPlan,
    settings: ServerSettings,
    functions: list[FunctionDefinition],
    template_tools: list[dict[str, Any]],
) -> ToolUse:
    if not settings.enable_auto_tool_choice:
        raise APIError(
            400,
            'tool_choice "auto" needs the server started with --enable-auto-tool-choice '
            "and --tool-call-parser",
            param="tool_choice",
        )
    strict = [i for i, function in enumerate(functions) if function.strict]
    if strict:
        raise APIError(
            400,
            "strict function schemas are followed only with tool_choice 'required' or "
            "a named function (the grammar constrains the arguments then)",
            param=f"tools.{strict[0]}.function.strict",
        )
    assert settings.tool_call_parser is not None  # ServerSettings checks
    parser = TOOL_PARSERS[settings.tool_call_parser]
    return ToolUse(
        template_tools,
        new_parser=parser,
        max_calls=1 if body.parallel_tool_calls is False else None,
        keeps_special_tokens=parser.keeps_special_tokens,
    )
