"""The tools a chat request offers the model, as functions with a JSON schema of their
arguments (OpenAI's shape, which chat templates render; Anthropic's and Ollama's tools
are translated into it), and the function a tool_choice may name. tool_use.py decides
what they make of the prompt, the grammar and the output."""

from __future__ import annotations

from typing import Any, Literal

from hetero_infer.server.serving.request_body import check_texts
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    # The JSON schema of the arguments object; None: the function takes none.
    parameters: dict[str, Any] | None = None
    # Whether the arguments must follow the schema exactly: the grammar makes them so
    # for tool_choice "required" or a named function (tool_use.py checks the rest).
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """Arguments are a JSON object, so their schema must describe one. (A grammar
        is built from it only when tool_choice constrains the output, and checked then.)"""
        return value if value is None else check_object_schema(value)

    @model_validator(mode="after")
    def _valid_texts(self) -> FunctionDefinition:
        # The chat template writes all of it into the prompt.
        check_texts([self.name, self.description, self.parameters])
        return self


def check_object_schema(value: dict[str, Any]) -> dict[str, Any]:
    """ValueError unless ``value`` is a JSON schema of an object (what a tool's
    arguments are; Anthropic's input_schema takes the same check)."""
    kind = value.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise ValueError("must be a JSON schema of an object (type 'object')")
    properties = value.get("properties", {})
    if not isinstance(properties, dict) or not all(
        isinstance(p, dict | bool) for p in properties.values()
    ):
        raise ValueError("'properties' must map names to JSON schemas")
    required = value.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError("'required' must be a list of property names")
    return value


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition

    def for_template(self) -> dict[str, Any]:
        """The tool as chat templates take it: OpenAI's JSON without the fields left
        out, so a template that writes a tool whole (Qwen's) shows no nulls."""
        return self.model_dump(exclude_none=True)


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """tool_choice naming the function the model must call."""

    type: Literal["function"]
    function: FunctionName
