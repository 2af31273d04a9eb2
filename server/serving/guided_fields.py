"""How a request constrains its output: OpenAI's ``response_format`` (which Ollama's
``format`` maps onto), vLLM's ``structured_outputs`` and its older top-level
``guided_*`` fields.

A body may constrain its output one way only: two of these set is a 400 naming both.
``structured_output()`` says which one was given, as the engine's
StructuredOutputsParams and the field it came in (errors from compiling it name that).
"""

from __future__ import annotations

from typing import Annotated, Any

from hetero_infer.engine.params.guided_decoding import CONSTRAINTS, StructuredOutputsParams
from hetero_infer.engine.settings.exceptions import ValidationError
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.request_body import NULL_SCHEMA, RequestBody
from pydantic import WithJsonSchema

# Schemas of the fields checked by hand (request_body.py says why they are written out).
# json_schema() takes these three, structured_output() the structural tag; any other
# keys are ignored.
RESPONSE_FORMAT_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"type": {"enum": ["text", "json_object"]}},
            "required": ["type"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "json_schema"},
                "json_schema": {
                    "type": "object",
                    "properties": {"schema": {"type": "object"}},
                    "required": ["schema"],
                },
            },
            "required": ["type", "json_schema"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "structural_tag"},
                "structures": {"type": "array", "items": {"type": "object"}, "minItems": 1},
                "triggers": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            },
            "required": ["type", "structures", "triggers"],
        },
        NULL_SCHEMA,
    ]
}
# structured_outputs' keys: one constraint, and options. disable_fallback (we have no
# fallback backend) and disable_any_whitespace (our JSON is compact anyway) change
# nothing here, so they are accepted.
STRUCTURED_OUTPUT_OPTIONS = (
    "whitespace_pattern",
    "disable_additional_properties",
    "disable_fallback",
    "disable_any_whitespace",
)
STRUCTURED_OUTPUTS_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "json": {"anyOf": [{"type": "object"}, {"type": "string"}]},
                "regex": {"type": "string"},
                "choice": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "grammar": {"type": "string"},
                "json_object": {"type": "boolean"},
                "structural_tag": {"anyOf": [{"type": "object"}, {"type": "string"}]},
                "whitespace_pattern": {"type": "string"},
                "disable_additional_properties": {"type": "boolean"},
                "disable_fallback": {"type": "boolean"},
                "disable_any_whitespace": {"type": "boolean"},
            },
            "additionalProperties": False,
            "minProperties": 1,
        },
        NULL_SCHEMA,
    ]
}
# What guided_decoding_backend may name: the backend we have (vLLM's name for it is
# "guidance"), or "auto", which leaves the choice to the server.
BACKENDS = ("guidance", "llguidance", "auto")
# The older top-level fields, and the structured_outputs key each stands for.
LEGACY_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    "structural_tag": "structural_tag",
}
JSON_KINDS = ("json", "json_object", "structural_tag")


class GuidedDecodingFields(RequestBody):
    """The fields that constrain the output."""

    # {"type": "text" | "json_object"}, {"type": "json_schema", "json_schema":
    # {"schema": {...}}} or vLLM's {"type": "structural_tag", ...}, checked by
    # json_schema() and structured_output() (for their messages).
    response_format: Annotated[dict[str, Any] | None, WithJsonSchema(RESPONSE_FORMAT_SCHEMA)] = None
    structured_outputs: Annotated[
        dict[str, Any] | None, WithJsonSchema(STRUCTURED_OUTPUTS_SCHEMA)
    ] = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None
    guided_decoding_backend: Annotated[str | None, WithJsonSchema({"enum": [*BACKENDS, None]})] = (
        None
    )
    guided_whitespace_pattern: str | None = None

    def json_schema(self) -> dict[str, Any] | None:
        """response_format as a JSON schema to constrain decoding to, or None (text, or
        a structural tag: structured_output() has that)."""
        fmt = self.response_format
        if fmt is None or fmt.get("type") in ("text", "structural_tag"):
            return None
        if fmt.get("type") == "json_object":
            return {"type": "object"}
        if fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise APIError(
                    400,
                    "response_format: json_schema needs {'name': ..., 'schema': {...}}",
                    param="response_format",
                )
            return schema
        raise APIError(
            400,
            "response_format: type must be 'text', 'json_object', 'json_schema' or "
            "'structural_tag'",
            param="response_format",
        )

    def structured_output(self) -> tuple[str, StructuredOutputsParams] | None:
        """The body's one structured output (not response_format's JSON schema, which
        takes the engine's json_schema path) and the field it came in; None without one.
        A 400 naming the fields for two constraints, or one that cannot be read."""
        given: list[tuple[str, Any]] = []
        if self.json_schema() is not None:
            given.append(("response_format", None))
        fmt = self.response_format or {}
        if fmt.get("type") == "structural_tag":
            tag = {key: value for key, value in fmt.items() if key != "type"}
            given.append(("response_format", ("structural_tag", tag)))
        if self.structured_outputs is not None:
            given.append(("structured_outputs", self._structured_outputs()))
        for name, key in LEGACY_FIELDS.items():
            value = getattr(self, name)
            if value is not None:
                given.append((name, (key, value)))
        if len(given) > 1:
            first, second = given[0][0], given[1][0]
            raise APIError(
                400,
                f"'{first}' and '{second}' both constrain the output: give one of them",
                param=second,
            )
        self._check_backend()
        whitespace = self.guided_whitespace_pattern
        if not given or given[0][1] is None:
            if whitespace is not None and not given:
                raise APIError(
                    400,
                    "guided_whitespace_pattern needs a JSON constraint (guided_json...)",
                    param="guided_whitespace_pattern",
                )
            return None
        field, value = given[0]
        if isinstance(value, StructuredOutputsParams):
            spec = value
            param = field if field != "structured_outputs" else f"{field}.{spec.kind}"
        else:
            key, constraint = value
            spec = _params(field, {key: constraint})
            param = field
        if whitespace is not None:
            if spec.kind not in JSON_KINDS:
                raise APIError(
                    400,
                    f"guided_whitespace_pattern applies to JSON, not to {param}",
                    param="guided_whitespace_pattern",
                )
            spec = spec.replace(whitespace_pattern=whitespace)
        return param, spec

    def _structured_outputs(self) -> StructuredOutputsParams:
        values = dict(self.structured_outputs or {})
        for key in values:
            if key not in CONSTRAINTS and key not in STRUCTURED_OUTPUT_OPTIONS:
                raise APIError(
                    400,
                    f"structured_outputs: unrecognized key '{key}'",
                    param=f"structured_outputs.{key}",
                )
        for key in ("disable_fallback", "disable_any_whitespace"):
            if not isinstance(values.pop(key, False), bool):
                raise APIError(400, f"structured_outputs.{key} must be true or false", param=key)
        return _params("structured_outputs", values)

    def _check_backend(self) -> None:
        backend = self.guided_decoding_backend
        if backend is not None and backend not in BACKENDS:
            raise APIError(
                400,
                f"guided_decoding_backend {backend!r} is not available: this server "
                "decodes with llguidance ('guidance')",
                param="guided_decoding_backend",
            )


def _params(field: str, values: dict[str, Any]) -> StructuredOutputsParams:
    """StructuredOutputsParams from a body's values; its errors name ``field``."""
    try:
        return StructuredOutputsParams(**values)
    except ValidationError as exc:
        param = field
        if field == "structured_outputs" and exc.param in values:
            param = f"{field}.{exc.param}"
        message = str(exc).replace("structured_outputs needs", f"{field} needs")
        if not message.startswith(param):
            message = f"{param}: {message}"
        raise APIError(400, message, param=param) from None
