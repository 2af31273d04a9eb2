"""OpenAI request bodies (pydantic, so the app's OpenAPI schema describes them), and
their mapping to SamplingParams.

Requests accept OpenAI's fields and vLLM's extras (top_k, min_p, ignore_eos, min_tokens,
stop_token_ids, include_stop_str_in_output, repetition_penalty, priority), and this
server's own time limit (timeout).
A field we do not implement yet is refused with a 400 naming it rather than
ignored: a client must never get silently different behaviour.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from hetero_infer.engine.sampling_params import (
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_N,
    RequestOutputKind,
    SamplingParams,
)
from hetero_infer.server.errors import APIError
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError

INT64_MAX = 2**63 - 1


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a token id is an integer, not true or false")
    return value


# Token ids: integers (5.0 too, as JSON Schema counts it), never booleans, which
# pydantic's lax ints would take for 0 and 1. (The schema says >= 0 as well, which the
# engine checks against the vocabulary.)
_TOKEN_ID_SCHEMA = {"type": "integer", "minimum": 0}
TokenId = Annotated[int, BeforeValidator(_not_a_bool), WithJsonSchema(_TOKEN_ID_SCHEMA)]
# OpenAI's limit on the inputs of one embeddings request.
MAX_EMBEDDING_INPUTS = 2048
# Bodies nest at most this deep (a JSON schema of 60 nested objects fits): deeper, the
# code that recurses into a part of a body (copying a schema, rendering a template)
# would run out of Python's stack, a 500 instead of a 400.
MAX_JSON_DEPTH = 128


class RequestBody(BaseModel):
    """What every request body checks before its fields: how deep it nests."""

    @model_validator(mode="before")
    @classmethod
    def _not_too_deep(cls, data: Any) -> Any:
        check_depth(data, MAX_JSON_DEPTH)
        return data


# Some fields are validated as loose dicts and checked by hand (for messages naming the
# field), so their schemas are written here, saying what those checks accept.
# A fuzzer or client generator reads these from the app's OpenAPI schema.
_NULL = {"type": "null"}
# json_schema() takes these three; any other keys are ignored.
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
        _NULL,
    ]
}
# ChatMessage.text() takes text parts only.
TEXT_PART_SCHEMA = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
CONTENT_SCHEMA = {
    "anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART_SCHEMA}, _NULL]
}
# What ChatMessage._tool_fields checks: only an assistant's message has tool_calls, and
# a tool message names the call it answers.
_NO_CALLS = {"type": "null"}
ROLE_RULES = [
    {"properties": {"role": {"enum": ["system", "user", "developer"]}, "tool_calls": _NO_CALLS}},
    {"properties": {"role": {"const": "assistant"}}},
    {
        "properties": {
            "role": {"const": "tool"},
            "tool_calls": _NO_CALLS,
            "tool_call_id": {"type": "string", "minLength": 1},
        },
        "required": ["tool_call_id"],
    },
]
# Token ids (as JSON object keys) -> biases, which SamplingParams bounds.
LOGIT_BIAS_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": {
                "type": "number",
                "minimum": -MAX_LOGIT_BIAS,
                "maximum": MAX_LOGIT_BIAS,
            },
        },
        _NULL,
    ]
}


class StreamOptions(BaseModel):
    include_usage: bool = False
    # vLLM's: with include_usage, every chunk carries the usage so far.
    continuous_usage_stats: bool = False


class SamplingFields(RequestBody):
    """Fields both completion routes share."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    # Bounded to int64: the sampler makes tensors and generators of them, and an
    # overflow there would kill the engine loop for every request.
    top_k: int | None = Field(default=None, ge=-1, le=INT64_MAX)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = Field(default=None, ge=0, le=INT64_MAX)
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    min_tokens: int = Field(default=0, ge=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    logit_bias: Annotated[dict[str, float] | None, WithJsonSchema(LOGIT_BIAS_SCHEMA)] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    # vLLM's v1 engine has no best_of either: only 1 is accepted.
    best_of: Annotated[int | None, WithJsonSchema({"enum": [1, None]})] = None
    # {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema":
    # {"schema": {...}}}, checked by json_schema() (for its messages).
    response_format: Annotated[dict[str, Any] | None, WithJsonSchema(RESPONSE_FORMAT_SCHEMA)] = None
    # vLLM's: with --scheduling-policy priority, lower values are served first (and
    # preempt running requests of higher values); any other value needs that policy.
    priority: int = 0
    # This server's own (vLLM, TGI and OpenAI have no such field): seconds the request
    # may take from its arrival, queueing included; it can shorten --request-timeout.
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Whether every chunk of a stream carries the usage so far (as in vLLM, only
        together with include_usage)."""
        return self.include_usage and bool(
            self.stream_options and self.stream_options.continuous_usage_stats
        )

    def unsupported(self) -> None:
        """Raise a 400 for any field set to something we cannot honour."""
        if self.best_of not in (None, 1):
            raise APIError(
                400,
                "'best_of' greater than 1 is not supported (nor by vLLM's v1 engine); "
                "use 'n' for several choices",
                param="best_of",
            )

    def json_schema(self) -> dict[str, Any] | None:
        """response_format as a JSON schema to constrain decoding to, or None for text."""
        fmt = self.response_format
        if fmt is None or fmt.get("type") == "text":
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
            "response_format: type must be 'text', 'json_object' or 'json_schema'",
            param="response_format",
        )

    def logprobs_params(self) -> dict[str, int]:
        """SamplingParams' logprobs / prompt_logprobs, from each route's own fields."""
        return {}

    def sampling_params(
        self, max_tokens: int, defaults: Mapping[str, Any] | None = None
    ) -> SamplingParams:
        """The body's SamplingParams (which check their own ranges); what needs the
        model (token ids, the schema) the engine's input processor checks. ``defaults``
        (the model's generation config) fill the sampling fields the body leaves out."""
        self.unsupported()
        values: dict[str, Any] = dict(defaults or {})
        values |= {
            "n": self.n,
            "max_tokens": max_tokens,
            "ignore_eos": self.ignore_eos,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "min_tokens": self.min_tokens,
        }
        names = (
            "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
            "presence_penalty", "frequency_penalty", "repetition_penalty",
        )  # fmt: skip
        for name in names:
            value = getattr(self, name)
            if value is not None:
                values[name] = value
        if self.logit_bias:
            values["logit_bias"] = _token_bias(self.logit_bias)
        values.update(self.logprobs_params())
        values["json_schema"] = self.json_schema()
        # A stream sends each step's part; an answer sent whole needs only the end.
        values["output_kind"] = (
            RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY
        )
        return SamplingParams(**values)


# A prompt as OpenAI takes it: a string, strings, token ids, or lists of token ids.
# None of them empty, which the schema says (the checks are _check_prompts' and the
# engine's input processor's).
_TEXT_SCHEMA = {"type": "string", "minLength": 1}
_IDS_SCHEMA = {"type": "array", "items": _TOKEN_ID_SCHEMA, "minItems": 1}
PROMPT_SCHEMA = {
    "anyOf": [
        _TEXT_SCHEMA,
        {"type": "array", "items": _TEXT_SCHEMA, "minItems": 1},
        _IDS_SCHEMA,
        {"type": "array", "items": _IDS_SCHEMA, "minItems": 1},
    ]
}
PromptField = Annotated[
    str | list[str] | list[TokenId] | list[list[TokenId]], WithJsonSchema(PROMPT_SCHEMA)
]


class CompletionRequest(SamplingFields):
    prompt: PromptField
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    # Not supported: only an empty one is accepted.
    suffix: Annotated[str | None, WithJsonSchema({"enum": ["", None]})] = None
    # OpenAI caps this at 5; vLLM's default max_logprobs is 20.
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def logprobs_params(self) -> dict[str, int]:
        if self.logprobs is None:
            return {}
        values = {"logprobs": self.logprobs}
        if self.echo:
            values["prompt_logprobs"] = self.logprobs
        return values

    @field_validator("prompt")
    @classmethod
    def _valid_prompts(cls, value: PromptField) -> PromptField:
        return _check_prompts(value, "prompt")

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts (text or token ids)."""
        return _prompt_list(self.prompt)


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    # The JSON schema of the arguments object; None: the function takes none.
    parameters: dict[str, Any] | None = None
    # Whether the arguments must follow the schema exactly: the grammar makes them so
    # for tool_choice "required" or a named function (tool_choice.py checks the rest).
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """Arguments are a JSON object, so their schema must describe one. (A grammar
        is built from it only when tool_choice constrains the output, and checked then.)"""
        if value is None:
            return value
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

    @model_validator(mode="after")
    def _valid_texts(self) -> FunctionDefinition:
        # The chat template writes all of it into the prompt.
        _check_texts([self.name, self.description, self.parameters])
        return self


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """tool_choice naming the function the model must call."""

    type: Literal["function"]
    function: FunctionName


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={"anyOf": ROLE_RULES})

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Annotated[str | list[dict[str, Any]] | None, WithJsonSchema(CONTENT_SCHEMA)] = None
    # An assistant's earlier calls, and the tool messages answering them (tool_call_id).
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _valid_text(cls, value: Any) -> Any:
        parts = value if isinstance(value, list) else [{"text": value}]
        for part in parts:
            if isinstance(part.get("text"), str):
                _check_text(part["text"])
        return value

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages have tool_calls")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            # As OpenAI: only an assistant's message that makes tool calls may go without.
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        # What else a chat template may write into the prompt (content is checked above).
        calls = [call.model_dump() for call in self.tool_calls or []]
        _check_texts([self.name, self.tool_call_id, calls])
        return self

    def text(self) -> str:
        """String content, or the text parts of list content joined."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(
                    400, "only text content parts are supported", param="messages.content"
                )
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[ToolDefinition] | None = None
    # None: "auto" when there are tools (as OpenAI and vLLM).
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Passed to the chat template (e.g. {"enable_thinking": false}).
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def unsupported(self) -> None:
        super().unsupported()
        for name in ("functions", "function_call"):
            if (self.model_extra or {}).get(name) is not None:
                raise APIError(
                    400,
                    f"'{name}' is OpenAI's deprecated form of tool calling: "
                    "use 'tools' and 'tool_choice'",
                    param=name,
                )

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        """One message naming the field, not one per member of the union."""
        if value is None or value in ("none", "auto", "required"):
            return value
        try:
            return NamedToolChoice.model_validate(value)
        except PydanticValidationError:
            raise ValueError(
                'must be "none", "auto", "required" or '
                '{"type": "function", "function": {"name": ...}}'
            ) from None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _valid_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        _check_texts(value)
        return value

    def logprobs_params(self) -> dict[str, int]:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(
                400, "logprobs must be set to true if top_logprobs is used", param="top_logprobs"
            )
        return {"logprobs": self.top_logprobs or 0} if self.logprobs else {}

    def template_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages)


class TokenizeRequest(RequestBody):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True

    @field_validator("prompt")
    @classmethod
    def _valid_text(cls, value: str | None) -> str | None:
        return value if value is None else _check_text(value)


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[TokenId]


class EmbeddingRequest(RequestBody):
    """/v1/embeddings. It has no extras to pass over: any other field is refused,
    naming it."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: PromptField
    encoding_format: Literal["float", "base64"] = "float"
    # Accepted only as the model's own size: it has no Matryoshka training, so a
    # shortened vector would not be a meaningful embedding.
    dimensions: int | None = None
    user: str | None = None

    @field_validator("input", mode="wrap")
    @classmethod
    def _valid_inputs(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> PromptField:
        try:
            value = handler(value)
        except PydanticValidationError:
            # One error naming the field, not one per member of the union it failed.
            raise ValueError(
                "input must be a string, a list of strings, a list of token ids or a list "
                "of lists of token ids"
            ) from None
        value = _check_prompts(value, "input")
        if isinstance(value, list) and len(value) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs in one request")
        return value

    def inputs(self) -> list[str | list[int]]:
        """The input field as a list of prompts (text or token ids)."""
        return _prompt_list(self.input)


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


def _check_prompts(value: PromptField, name: str) -> PromptField:
    """A prompt field is not an empty list, and its texts are valid Unicode."""
    if isinstance(value, list) and not value:
        raise ValueError(f"{name} must not be empty")
    for text in [value] if isinstance(value, str) else value:
        if isinstance(text, str):
            _check_text(text)
    return value


def _prompt_list(value: PromptField) -> list[str | list[int]]:
    """A prompt field as a list of prompts (text or token ids)."""
    if isinstance(value, str):
        return [value]
    if all(isinstance(x, int) for x in value):
        return [value]  # type: ignore[list-item]
    return list(value)  # type: ignore[arg-type]


def _token_bias(logit_bias: dict[str, float]) -> dict[int, float]:
    """OpenAI sends token ids as JSON object keys, so as strings."""
    bias = {}
    for key, value in logit_bias.items():
        try:
            token_id = int(key)
        except ValueError:
            shown = key if len(key) <= 32 else key[:32] + "..."  # it may be megabytes long
            raise APIError(
                400, f"logit_bias: key {shown!r} is not a token id", param="logit_bias"
            ) from None
        bias[token_id] = value
    return bias


def _check_text(text: str) -> str:
    """JSON can carry lone surrogates ("\\ud800"): no tokenizer takes them, so refuse here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (it has a lone surrogate)") from None
    return text


def _check_texts(value: Any) -> None:
    """Every string in ``value``, at any depth and dict keys too, is valid Unicode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates take them: role and text content, and an assistant's
    tool calls with their arguments as objects (templates write them with ``tojson``),
    a tool message's tool_call_id, and a name where given."""
    rendered = []
    for i, message in enumerate(messages):
        entry: dict[str, Any] = {"role": message.role, "content": message.text()}
        if message.name is not None:
            entry["name"] = message.name
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        if message.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _arguments_object(call.function.arguments, i),
                    },
                }
                for call in message.tool_calls
            ]
        rendered.append(entry)
    return rendered


def _arguments_object(arguments: str, message_index: int) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise APIError(
            400,
            "a tool call's arguments must be a JSON object",
            param=f"messages.{message_index}.tool_calls",
        )
    return value
