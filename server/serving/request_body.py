"""What every request body shares, whichever API family's: a bound on how deep it
nests, no field it does not know, token ids that are integers and never booleans, and
texts that are valid Unicode.

Each is refused with a 400 naming the field, never a 500: the checks run before
anything recurses into a body or hands its text to a tokenizer.

A field neither OpenAI nor vLLM defines is refused in OpenAI's words ("Unrecognized
request argument supplied: <name>"); one they define that we do not implement is
refused naming it, unless it holds null or a value that changes nothing (a body's
``UNSUPPORTED``). Either is raised as the route's APIError from inside validation:
pydantic passes on exceptions that are not ValueErrors, and the app's handler answers
them. (So validating a body outside a route raises APIError for these too.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from hetero_infer.server.errors import APIError
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    WithJsonSchema,
    model_validator,
)

# The most inputs one embedding request takes, in every family: OpenAI's limit.
MAX_EMBEDDING_INPUTS = 2048

# Bodies nest at most this deep (a JSON schema of 60 nested objects fits): deeper, the
# code that recurses into a part of a body (copying a schema, rendering a template)
# would run out of Python's stack, a 500 instead of a 400.
MAX_JSON_DEPTH = 128


@dataclass(frozen=True)
class Unsupported:
    """A field OpenAI or vLLM defines that a route does not implement: the values
    (besides null) that change nothing and are accepted, and why it is refused."""

    harmless: tuple[Any, ...] = ()
    why: str = "is not supported by this server"

    def allows(self, value: Any) -> bool:
        # Type and value: 0 must not pass for false.
        return value is None or any(type(value) is type(ok) and value == ok for ok in self.harmless)


class RequestBody(BaseModel):
    """What every request body checks before its fields: how deep it nests, and that
    it has no field it does not know (the schema says so: additionalProperties false)."""

    model_config = ConfigDict(extra="forbid")
    # Fields OpenAI or vLLM define for this route that it does not implement.
    UNSUPPORTED: ClassVar[Mapping[str, Unsupported]] = {}

    @model_validator(mode="before")
    @classmethod
    def _not_too_deep(cls, data: Any) -> Any:
        check_depth(data, MAX_JSON_DEPTH)
        if not isinstance(data, dict) or all(name in cls.model_fields for name in data):
            return data
        # What is left are unsupported fields holding values that change nothing.
        return {name: value for name, value in data.items() if cls._declared(name, value)}

    @classmethod
    def _declared(cls, name: str, value: Any) -> bool:
        """Whether ``name`` is a field of the body; a 400 unless it is one, or an
        unsupported field that ``value`` leaves harmless."""
        if name in cls.model_fields:
            return True
        unsupported = cls.UNSUPPORTED.get(name)
        if unsupported is None:
            shown = name if len(name) <= 64 else name[:64] + "..."  # it may be megabytes long
            raise APIError(400, f"Unrecognized request argument supplied: {shown}", param=shown)
        if not unsupported.allows(value):
            raise APIError(400, f"'{name}' {unsupported.why}", param=name)
        return False


def check_depth(value: Any, limit: int) -> None:
    """ValueError if ``value`` (parsed JSON) nests more than ``limit`` levels deep.
    Iterative, so a deep value cannot exhaust the stack here either."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, dict | list):
                if depth >= limit:
                    raise ValueError(f"the body nests more than {limit} levels deep")
                stack.append((child, depth + 1))


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a token id is an integer, not true or false")
    return value


# Token ids: integers (5.0 too, as JSON Schema counts it), never booleans, which
# pydantic's lax ints would take for 0 and 1. (The schema says >= 0 as well, which the
# engine checks against the vocabulary.)
TOKEN_ID_SCHEMA = {"type": "integer", "minimum": 0}
TokenId = Annotated[int, BeforeValidator(_not_a_bool), WithJsonSchema(TOKEN_ID_SCHEMA)]

# Some fields are validated as loose dicts and checked by hand (for messages naming the
# field), so their schemas are written out, saying what those checks accept (each
# request module has some, most of them nullable: this is their null). A fuzzer or
# client generator reads these from the app's OpenAPI schema.
NULL_SCHEMA = {"type": "null"}


def check_text(text: str) -> str:
    """JSON can carry lone surrogates ("\\ud800"): no tokenizer takes them, so refuse here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (it has a lone surrogate)") from None
    return text


def check_texts(value: Any) -> None:
    """Every string in ``value``, at any depth and dict keys too, is valid Unicode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            check_text(item)
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item


def _valid_texts(value: Any) -> Any:
    check_texts(value)
    return value


# A JSON object of the body (a template's variables, a tool's input) whose strings, its
# keys' too, must be valid Unicode.
JsonObject = Annotated[dict[str, Any], AfterValidator(_valid_texts)]
