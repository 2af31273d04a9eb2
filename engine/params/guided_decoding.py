"""StructuredOutputsParams: the constraints beyond a JSON schema that decoding can follow
(vLLM's names): a choice of strings, a regex, a context-free grammar (Lark, or GBNF /
EBNF as llama.cpp writes it), any JSON object, a JSON schema with options, and
structural tags (JSON inside tags in free text). Exactly one constraint per request.

``grammar_text`` turns one into llguidance's grammar; StructuredOutput compiles it.
A regex or a choice must match the whole output, as in vLLM.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, fields
from typing import Any

from hetero_infer.engine.settings.exceptions import ValidationError

CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# Grammar texts (a regex, a grammar, the choices together) are bounded: llguidance
# compiles a Lark grammar recursively, so a chain of rules ~100,000 deep would exhaust
# even the compile thread's large stack (structured_output.py); 128 KiB of text is at
# most ~22,000 rules, and compiles in well under a second.
MAX_GRAMMAR_CHARS = 128 * 1024
# A schema or structural tag given as JSON text nests at most as deep as a request
# body may (the server checks bodies, not the texts in them): copying a deeper one
# would exhaust Python's stack.
MAX_JSON_TEXT_DEPTH = 128
# Compact JSON: without this the grammar lets a model pad with endless whitespace.
COMPACT_JSON = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


@dataclass(frozen=True)
class StructuredOutputsParams:
    """One constraint (the first six fields: set exactly one) and the JSON options.

    ``json``: a JSON schema (an object, or its JSON text); ``json_object``: true for
    any JSON object; ``structural_tag``: ``{"structures": [{"begin", "schema", "end"}],
    "triggers": [...]}`` (or its JSON text): free text in which each structure starts
    at one of its triggers, holds JSON its schema validates, and ends with ``end``.
    ``whitespace_pattern``: the regex JSON's whitespace follows (default: compact JSON);
    ``disable_additional_properties``: objects with ``properties`` take no others.
    """

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    whitespace_pattern: str | None = None
    disable_additional_properties: bool = False

    def __post_init__(self) -> None:
        given = [name for name in CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValidationError(
                "structured_outputs needs exactly one of "
                f"{', '.join(CONSTRAINTS)}; got {', '.join(given) or 'none'}",
                param="structured_outputs",
            )
        for name in ("regex", "grammar", "whitespace_pattern"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValidationError(f"{name} must be a string", param=name)
        if self.choice is not None and (
            not isinstance(self.choice, list)
            or not self.choice
            or not all(isinstance(c, str) for c in self.choice)
        ):
            raise ValidationError("choice must be a non-empty list of strings", param="choice")
        if self.json_object not in (None, True, False):
            raise ValidationError("json_object must be true or false", param="json_object")
        if not isinstance(self.disable_additional_properties, bool):
            raise ValidationError(
                "disable_additional_properties must be true or false",
                param="disable_additional_properties",
            )
        if self.json is not None and not isinstance(self.json, dict | str):
            raise ValidationError("json must be a JSON schema or its JSON text", param="json")
        size = sum(len(c) + 1 for c in self.choice or []) + len(self.regex or self.grammar or "")
        if size > MAX_GRAMMAR_CHARS:
            raise ValidationError(
                f"{self.kind}: at most {MAX_GRAMMAR_CHARS} characters", param=self.kind
            )

    @property
    def kind(self) -> str:
        """The constraint given: one of CONSTRAINTS."""
        return next(name for name in CONSTRAINTS if getattr(self, name) not in (None, False))

    def replace(self, **changes: Any) -> StructuredOutputsParams:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return StructuredOutputsParams(**(values | changes))


def grammar_text(spec: StructuredOutputsParams) -> str:
    """llguidance's grammar for ``spec``. ValueError (naming nothing: the caller knows
    the field) for a schema or tag description that cannot be read; a regex or grammar
    that does not compile shows up when the matcher is built."""
    import llguidance

    kind = spec.kind
    if kind == "regex":
        assert spec.regex is not None
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if kind == "choice":
        assert spec.choice is not None
        # A regex alternation of the literal strings: compiles far faster than a Lark
        # rule with one alternative per string.
        return llguidance.LLMatcher.grammar_from_regex("|".join(map(_literal, spec.choice)))
    if kind == "grammar":
        assert spec.grammar is not None
        return llguidance.grammar_from("grammar", spec.grammar)  # Lark, or GBNF converted
    if kind == "structural_tag":
        return _structural_tags(spec)
    schema = {"type": "object"} if kind == "json_object" else _schema(spec.json)
    return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(json_options(schema, spec)))


def json_options(schema: dict[str, Any], spec: StructuredOutputsParams | None) -> dict[str, Any]:
    """The schema with our JSON formatting (compact unless a whitespace pattern is
    given) and, if asked, no additional properties; the caller's schema is not changed."""
    schema = copy.deepcopy(schema)
    if spec is not None and spec.disable_additional_properties:
        _no_additional_properties(schema)
    options = dict(COMPACT_JSON)
    if spec is not None and spec.whitespace_pattern is not None:
        options = {"whitespace_pattern": spec.whitespace_pattern}
    schema.setdefault("x-guidance", options)
    return schema


def _schema(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = _json_text(value, "the schema is not valid JSON")
    if not isinstance(value, dict):
        raise ValueError("a JSON schema must be an object")
    return value


def _json_text(text: str, invalid: str) -> Any:
    """The value of a JSON text, at most MAX_JSON_TEXT_DEPTH levels deep; ValueError
    (``invalid`` where it is not JSON) otherwise. The depth is measured without
    recursion, and json.loads gives up near 1,000 levels with a RecursionError."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError(invalid) from None
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        for child in children:
            if isinstance(child, dict | list):
                if depth >= MAX_JSON_TEXT_DEPTH:
                    raise ValueError(f"the JSON nests more than {MAX_JSON_TEXT_DEPTH} levels deep")
                stack.append((child, depth + 1))
    return value


def _literal(text: str) -> str:
    """``text`` as a regex matching only itself: every character but letters, digits
    and space as a \\x{...} escape, which the regex syntax takes for any code point."""
    return "".join(
        c if c.isascii() and (c.isalnum() or c == " ") else f"\\x{{{ord(c):x}}}" for c in text
    )


def _no_additional_properties(schema: Any) -> None:
    """vLLM's disable_additional_properties: every object schema listing properties
    takes no others (unless it says otherwise). Iterative: schemas nest deep."""
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if ("properties" in item or "patternProperties" in item) and (
                "additionalProperties" not in item
            ):
                item["additionalProperties"] = False
            stack += item.values()
        elif isinstance(item, list):
            stack += item


def _structural_tags(spec: StructuredOutputsParams) -> str:
    """vLLM's structural tag, {"structures": [{"begin", "schema", "end"}], "triggers"},
    as llguidance's StructTag grammar: free text, and from each trigger on, the tag."""
    import llguidance

    value = spec.structural_tag
    if isinstance(value, str):
        value = _json_text(value, "not valid JSON")
    if not isinstance(value, dict) or "structures" not in value:
        raise ValueError(
            'must be {"structures": [{"begin": ..., "schema": {...}, "end": ...}], '
            '"triggers": [...]}'
        )
    triggers, structures = value.get("triggers"), value["structures"]
    if not _strings(triggers) or not triggers or not all(triggers):
        raise ValueError("triggers must be a non-empty list of non-empty strings")
    if not isinstance(structures, list) or not structures:
        raise ValueError("structures must be a non-empty list")
    tags = []
    for i, structure in enumerate(structures):
        if not isinstance(structure, dict) or not _strings(
            [structure.get("begin"), structure.get("end")]
        ):
            raise ValueError(f"structures[{i}] needs 'begin' and 'end' strings and a 'schema'")
        begin = structure["begin"]
        trigger = next((t for t in triggers if begin.startswith(t)), None)
        if trigger is None:
            raise ValueError(f"structures[{i}]: 'begin' starts with none of the triggers")
        schema = json_options(_schema(structure.get("schema", {})), spec)
        tags.append(
            llguidance.StructTag(trigger=trigger, begin=begin, grammar=schema, end=structure["end"])
        )
    return llguidance.StructTag.to_grammar(tags)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
