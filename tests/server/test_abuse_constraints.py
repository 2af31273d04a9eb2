"""Hostile output constraints on every route that takes one: JSON schemas nested deep,
chained through thousands of $refs, looping, with huge enums and alternations and
catastrophic patterns; regexes, grammars and choices that are malformed, recursive
or huge.

Schemas go where each route takes them: structured_outputs / guided_json on
/v1/completions and /v1/chat/completions, text.format on /v1/responses, a tool's
input_schema (tool_choice any) on /v1/messages, format on /api/chat and
/api/generate. Regexes, grammars and choices: structured_outputs and guided_* on the
two OpenAI routes. Each is answered fast, a 400 in the route's shape or a 200 where
the constraint is fine (llguidance bounds the work), and the route serves afterwards
with no KV block held (test_abuse_routes.check_abuse).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import LiveServer
from tests.server.test_abuse_routes import (
    CHAT,
    COMPLETIONS,
    MESSAGES,
    OLLAMA_CHAT,
    OLLAMA_GENERATE,
    RESPONSES,
    Abuse,
    chat,
    check_abuse,
    completions,
    messages,
    ollama_chat,
    ollama_generate,
    responses,
)

# Where each route takes a JSON schema: (path, the body holding the schema).
SCHEMA_PLACES: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "completions-structured-outputs": (
        COMPLETIONS,
        lambda schema: completions(structured_outputs={"json": schema}),
    ),
    "chat-guided-json": (CHAT, lambda schema: chat(guided_json=schema)),
    "responses-text-format": (
        RESPONSES,
        lambda schema: responses(
            text={"format": {"type": "json_schema", "name": "answer", "schema": schema}}
        ),
    ),
    "messages-tool-input-schema": (
        MESSAGES,
        lambda schema: messages(
            tools=[{"name": "f", "input_schema": schema}], tool_choice={"type": "any"}
        ),
    ),
    "ollama-chat-format": (OLLAMA_CHAT, lambda schema: ollama_chat(format=schema)),
    "ollama-generate-format": (OLLAMA_GENERATE, lambda schema: ollama_generate(format=schema)),
}


def object_of(schema: dict[str, Any], **top: Any) -> dict[str, Any]:
    """``schema`` as the one required property of an object (a tool's input_schema
    must describe an object); ``top`` adds keys at the top ($defs)."""
    return {"type": "object", "properties": {"a": schema}, "required": ["a"], **top}


def nested(levels: int) -> dict[str, Any]:
    """An object schema ``levels`` objects deep (each nests the body 2 levels deeper)."""
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(levels - 1):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def ref_chain(length: int) -> dict[str, Any]:
    """A property whose schema is reached through ``length`` $refs, one after another."""
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(length)}
    defs[f"d{length}"] = {"type": "string"}
    return object_of({"$ref": "#/$defs/d0"}, **{"$defs": defs})


def deep_json_text(depth: int) -> str:
    """A JSON schema as text, ``depth`` objects deep."""
    return '{"items": ' * (depth - 1) + "{}" + "}" * (depth - 1)


def alternation(count: int) -> str:
    return "|".join(f"w{i}" for i in range(count))


# id -> (the schema, the status on every route, a word of the error's message).
HOSTILE_SCHEMAS: dict[str, tuple[dict[str, Any], int, str | None]] = {
    # Past the body's depth limit before anything recurses into it.
    "nested-100-objects": (nested(100), 400, "nests"),
    # Within it: compiled and served.
    "nested-40-objects": (nested(40), 200, None),
    "ref-chain-3000": (ref_chain(3000), 200, None),
    # Regexes match by derivatives: catastrophic ones cost nothing.
    "catastrophic-pattern": (object_of({"type": "string", "pattern": "^(a+)+$"}), 200, None),
    "exponential-pattern": (object_of({"type": "string", "pattern": "^(.*a.{40}b)+$"}), 200, None),
    "pattern-alternation-20k": (
        object_of({"type": "string", "pattern": f"^({alternation(20_000)})$"}),
        200,
        None,
    ),
    "malformed-pattern": (object_of({"type": "string", "pattern": "(((a"}), 400, None),
    # Too big for llguidance's limits: refused when compiled.
    "enum-100k": (object_of({"enum": [f"value {i}" for i in range(100_000)]}), 400, None),
    # Loops at the root: refused when compiled.
    "ref-loop": ({"type": "object", "$ref": "#"}, 400, "schema"),
    "ref-cycle": (
        {
            "type": "object",
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
            "$ref": "#/$defs/a",
        },
        400,
        "schema",
    ),
    "empty-enum": (object_of({"enum": []}), 400, None),
    # Keywords llguidance does not implement are named.
    "not-keyword": (object_of({"not": {"type": "string"}}), 400, "not"),
}
SCHEMA_CASES = [
    Abuse(f"{kind}-{place}", path, build(schema), status, message)
    for kind, (schema, status, message) in HOSTILE_SCHEMAS.items()
    for place, (path, build) in SCHEMA_PLACES.items()
]


def structured(field: str, value: Any) -> dict[str, Any]:
    """A completions body with ``value`` under structured_outputs' ``field``."""
    return completions(structured_outputs={field: value})


HUGE = 200 * 1024  # over the 128 KiB a regex, grammar or list of choices may take
GUIDED_CASES = [
    # Regexes: by derivatives, so catastrophic ones are served.
    Abuse("regex-catastrophic", COMPLETIONS, structured("regex", "(a+)+$"), 200),
    Abuse("regex-exponential", CHAT, chat(guided_regex="(.*a.{40}b)+"), 200),
    Abuse("regex-nested-stars", COMPLETIONS, completions(guided_regex="((a*)*)*b"), 200),
    Abuse(
        "regex-alternation-15k", CHAT, chat(structured_outputs={"regex": alternation(15_000)}), 200
    ),
    # Past the regex parser's nesting limit. (The message quotes the regex whole: 300
    # groups keep it short; 5,000 would make it 10 KB.)
    Abuse(
        "regex-300-nested-groups",
        COMPLETIONS,
        structured("regex", "(" * 300 + "a" + ")" * 300),
        message="invalid regex",
    ),
    Abuse("regex-over-128k", COMPLETIONS, structured("regex", "a" * HUGE), message="131072"),
    Abuse("regex-malformed", CHAT, chat(guided_regex="(((a"), message="guided_regex"),
    # Grammars: Lark and GBNF, malformed, recursive, long chains, huge.
    Abuse("grammar-malformed", COMPLETIONS, structured("grammar", "start: ("), message="grammar"),
    Abuse("gbnf-malformed", CHAT, chat(guided_grammar='root ::= ("a"'), message="guided_grammar"),
    Abuse(
        "grammar-left-recursive", COMPLETIONS, structured("grammar", 'start: start "a" | "a"'), 200
    ),
    Abuse("grammar-self-loop", CHAT, chat(guided_grammar="start: start"), 400),
    Abuse(
        "grammar-mutual-loop",
        COMPLETIONS,
        structured("grammar", "start: b\nb: c\nc: start"),
        400,
    ),
    Abuse("gbnf-recursive", CHAT, chat(guided_grammar='root ::= "(" root ")" | "x"'), 200),
    Abuse(
        "grammar-chain-5000-rules",
        COMPLETIONS,
        structured(
            "grammar",
            "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(5000)) + 'r5000: "x"',
        ),
        200,
    ),
    Abuse(
        "grammar-over-128k",
        CHAT,
        chat(guided_grammar='start: "' + "a" * HUGE + '"'),
        message="131072",
    ),
    # Choices.
    Abuse("choice-2000", CHAT, chat(guided_choice=[f"option {i}" for i in range(2000)]), 200),
    Abuse(
        "choice-over-128k", COMPLETIONS, structured("choice", ["x" * 1000] * 200), message="131072"
    ),
    Abuse("choice-empty", CHAT, chat(guided_choice=[])),
    # Structural tags and JSON given as text.
    # A tag whose schema loops: free text is fine until a trigger opens the tag.
    Abuse(
        "structural-tag-ref-loop",
        COMPLETIONS,
        structured(
            "structural_tag",
            {
                "structures": [{"begin": "<f>", "schema": {"$ref": "#"}, "end": "</f>"}],
                "triggers": ["<f"],
            },
        ),
        200,
    ),
    Abuse("structural-tag-not-json", CHAT, chat(structural_tag="{"), message="structural_tag"),
    Abuse("json-text-not-json", COMPLETIONS, structured("json", "{"), message="structured_outputs"),
    # A schema as JSON text nests no deeper than a body may (a 500 before: its copy
    # recursed past Python's stack).
    Abuse("json-text-600-deep", CHAT, chat(guided_json=deep_json_text(600)), message="nests"),
    Abuse("json-text-100k-deep", COMPLETIONS, structured("json", deep_json_text(100_000))),
    Abuse(
        "structural-tag-text-600-deep",
        CHAT,
        chat(structural_tag='{"structures": ' + deep_json_text(600) + "}"),
        message="nests",
    ),
]


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def test_the_cases_are_distinct():
    cases = SCHEMA_CASES + GUIDED_CASES + FAILING_AT_THE_FIRST_TOKEN
    assert len({case.id for case in cases}) == len(cases)


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=[case.id for case in SCHEMA_CASES])
def test_hostile_schema(http: httpx.Client, server: LiveServer, case: Abuse):
    check_abuse(http, server, case)


@pytest.mark.parametrize("case", GUIDED_CASES, ids=[case.id for case in GUIDED_CASES])
def test_hostile_regex_grammar_or_choice(http: httpx.Client, server: LiveServer, case: Abuse):
    check_abuse(http, server, case)


# Constraints that compile and give their first mask, then fail on the next token: an
# alternation wider than llguidance's row limit (2,000 items), a schema or grammar that
# forces an output without end below its root. Building the grammar steps it over its
# first tokens, so each is a 400 naming its field before anything runs.
# (test_constraint_failures.py has those that fail later, mid-generation.)
WIDE = 2500
ROOM = {"max_tokens": 12}
FORCED_TOOLS = [
    {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
    for i in range(WIDE)
]
LOOP_BELOW_THE_ROOT = object_of({"$ref": "#"})
FAILS_ON_ITS_FIRST_TOKEN = "cannot be followed past the first token"
FAILING_AT_THE_FIRST_TOKEN = [
    Abuse(
        "tools-2500-required-chat",
        CHAT,
        chat(tools=FORCED_TOOLS, tool_choice="required", **ROOM),
        message="tools: the schema " + FAILS_ON_ITS_FIRST_TOKEN,
    ),
    Abuse(
        "tools-2500-required-responses",
        RESPONSES,
        responses(
            tools=[{"type": "function", **tool["function"]} for tool in FORCED_TOOLS],
            tool_choice="required",
        ),
        message="tools: the schema " + FAILS_ON_ITS_FIRST_TOKEN,
    ),
    Abuse(
        "tools-2500-any-messages",
        MESSAGES,
        messages(
            tools=[{"name": f"f{i}", "input_schema": {"type": "object"}} for i in range(WIDE)],
            tool_choice={"type": "any"},
            max_tokens=12,
        ),
        message="tools: the schema " + FAILS_ON_ITS_FIRST_TOKEN,
    ),
    Abuse(
        "anyof-2500-objects-responses",
        RESPONSES,
        responses(
            text={
                "format": {
                    "type": "json_schema",
                    "name": "answer",
                    "schema": {"anyOf": [object_of({"const": f"v{i}"}) for i in range(WIDE)]},
                }
            },
            max_output_tokens=12,
        ),
        message="text.format: the schema " + FAILS_ON_ITS_FIRST_TOKEN,
    ),
    Abuse(
        "grammar-2500-alternatives",
        COMPLETIONS,
        structured("grammar", "start: " + " | ".join(f'"w{i}"' for i in range(WIDE))) | ROOM,
        message="structured_outputs.grammar: the grammar " + FAILS_ON_ITS_FIRST_TOKEN,
    ),
    Abuse(
        "grammar-no-base-case",
        COMPLETIONS,
        structured("grammar", 'start: "a" start') | ROOM,
        message="structured_outputs.grammar: the grammar " + FAILS_ON_ITS_FIRST_TOKEN,
    ),
    Abuse(
        "loop-below-the-root-chat",
        CHAT,
        chat(guided_json=LOOP_BELOW_THE_ROOT, **ROOM),
        message="guided_json: the schema " + FAILS_ON_ITS_FIRST_TOKEN,
    ),
    Abuse(
        "loop-below-the-root-messages",
        MESSAGES,
        messages(
            tools=[{"name": "f", "input_schema": LOOP_BELOW_THE_ROOT}],
            tool_choice={"type": "tool", "name": "f"},
            max_tokens=12,
        ),
        message="tools: the schema " + FAILS_ON_ITS_FIRST_TOKEN,
    ),
    Abuse(
        "loop-below-the-root-ollama",
        OLLAMA_CHAT,
        ollama_chat(format=LOOP_BELOW_THE_ROOT, options={"num_predict": 12}),
        message="format: the schema " + FAILS_ON_ITS_FIRST_TOKEN,
    ),
]


@pytest.mark.parametrize(
    "case", FAILING_AT_THE_FIRST_TOKEN, ids=[case.id for case in FAILING_AT_THE_FIRST_TOKEN]
)
def test_constraint_that_fails_at_its_first_token(
    http: httpx.Client, server: LiveServer, case: Abuse
):
    check_abuse(http, server, case)
