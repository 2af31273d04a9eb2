"""guided_fields.py: which one of a body's fields constrains its output, as the
engine's StructuredOutputsParams and the field a compile error names; the 400s for
two constraints, unknown keys, a backend we do not have and misplaced whitespace."""

from __future__ import annotations

from typing import Any

import pytest
from hetero_infer.engine.params.guided_decoding import StructuredOutputsParams
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.guided_fields import GuidedDecodingFields

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
TAG = {"structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}], "triggers": ["<f"]}


def fields(**values: Any) -> GuidedDecodingFields:
    return GuidedDecodingFields(**values)


def refused(param: str, match: str, **values: Any) -> None:
    """The body is a 400 naming ``param``, with ``match`` in its message."""
    with pytest.raises(APIError, match=match) as error:
        fields(**values).structured_output()
    assert error.value.status_code == 400 and error.value.param == param


@pytest.mark.parametrize(
    ("response_format", "schema"),
    [
        (None, None),
        ({"type": "text"}, None),
        ({"type": "structural_tag", **TAG}, None),
        ({"type": "json_object"}, {"type": "object"}),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}, SCHEMA),
    ],
)
def test_response_format_as_a_json_schema(response_format, schema):
    assert fields(response_format=response_format).json_schema() == schema


@pytest.mark.parametrize(
    ("response_format", "match"),
    [
        ({"type": "json_schema"}, "json_schema needs"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema needs"),
        ({"type": "json_schema", "json_schema": {"schema": "{}"}}, "json_schema needs"),
        ({"type": "xml"}, "type must be"),
        ({}, "type must be"),
    ],
)
def test_a_response_format_that_cannot_be_read(response_format, match):
    with pytest.raises(APIError, match=match) as error:
        fields(response_format=response_format).json_schema()
    assert error.value.param == "response_format"


@pytest.mark.parametrize(
    ("values", "param", "spec"),
    [
        ({"guided_json": SCHEMA}, "guided_json", StructuredOutputsParams(json=SCHEMA)),
        ({"guided_regex": "a+"}, "guided_regex", StructuredOutputsParams(regex="a+")),
        ({"guided_choice": ["a"]}, "guided_choice", StructuredOutputsParams(choice=["a"])),
        ({"guided_grammar": "g"}, "guided_grammar", StructuredOutputsParams(grammar="g")),
        ({"structural_tag": TAG}, "structural_tag", StructuredOutputsParams(structural_tag=TAG)),
        (
            {"response_format": {"type": "structural_tag", **TAG}},
            "response_format",
            StructuredOutputsParams(structural_tag=TAG),
        ),
        (
            {"structured_outputs": {"regex": "a+", "disable_fallback": True}},
            "structured_outputs.regex",
            StructuredOutputsParams(regex="a+"),
        ),
        (
            {"guided_json": SCHEMA, "guided_whitespace_pattern": " ?"},
            "guided_json",
            StructuredOutputsParams(json=SCHEMA, whitespace_pattern=" ?"),
        ),
        (
            {"structured_outputs": {"json_object": True}, "guided_decoding_backend": "guidance"},
            "structured_outputs.json_object",
            StructuredOutputsParams(json_object=True),
        ),
    ],
)
def test_the_one_constraint_and_the_field_it_came_in(values, param, spec):
    assert fields(**values).structured_output() == (param, spec)


def test_no_structured_output_without_one():
    assert fields().structured_output() is None
    assert fields(guided_decoding_backend="auto").structured_output() is None
    # response_format's JSON schema takes the engine's json_schema path.
    assert fields(response_format={"type": "json_object"}).structured_output() is None
    assert fields(response_format={"type": "text"}).structured_output() is None


@pytest.mark.parametrize(
    ("values", "second"),
    [
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        ({"structured_outputs": {"regex": "a"}, "guided_choice": ["a"]}, "guided_choice"),
        ({"guided_json": SCHEMA, "structural_tag": TAG}, "structural_tag"),
        (
            {
                "response_format": {"type": "structural_tag", **TAG},
                "structured_outputs": {"regex": "a"},
            },
            "structured_outputs",
        ),
    ],
)
def test_two_constraints_are_refused_naming_both(values, second):
    first = next(iter(values))
    refused(second, f"'{first}' and '{second}' both constrain", **values)


def test_structured_outputs_keys():
    refused(
        "structured_outputs.schema", "unrecognized key 'schema'", structured_outputs={"schema": {}}
    )
    refused(
        "disable_fallback",
        "must be true or false",
        structured_outputs={"regex": "a", "disable_fallback": 1},
    )
    refused(
        "disable_any_whitespace",
        "must be true or false",
        structured_outputs={"regex": "a", "disable_any_whitespace": "yes"},
    )
    # The engine's own checks name the key under structured_outputs, or the field.
    refused("structured_outputs.choice", "choice must be", structured_outputs={"choice": [1]})
    refused("structured_outputs", "structured_outputs needs exactly one", structured_outputs={})
    refused("guided_choice", "guided_choice: choice must be", guided_choice=[])


def test_a_backend_we_do_not_have_is_refused():
    refused(
        "guided_decoding_backend", "'xgrammar' is not available", guided_decoding_backend="xgrammar"
    )
    refused(
        "guided_decoding_backend",
        "not available",
        guided_decoding_backend="outlines",
        guided_regex="a",
    )


def test_a_whitespace_pattern_needs_a_json_constraint():
    refused("guided_whitespace_pattern", "needs a JSON constraint", guided_whitespace_pattern=" ")
    refused(
        "guided_whitespace_pattern",
        "applies to JSON, not to guided_regex",
        guided_regex="a",
        guided_whitespace_pattern=" ",
    )
    # With response_format's JSON schema, the engine's json_schema path has its own.
    assert (
        fields(
            response_format={"type": "json_object"}, guided_whitespace_pattern=" "
        ).structured_output()
        is None
    )
