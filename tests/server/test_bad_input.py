"""Malformed and out-of-range requests: each gets the right 4xx in OpenAI's error shape,
none a 5xx, and the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, LiveServer
from tests.server.openai_shapes import check_error_body

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Hello"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
LONG_TEXT = "a " * 600  # about 600 tokens: more than max_model_len (512)


@dataclass
class Case:
    id: str
    path: str
    body: dict[str, Any] | bytes  # bytes go out as they are, as JSON
    status: int = 400
    param: str | None = None  # checked when given
    message: str | None = None  # a substring of the message, checked when given
    code: str | None = None  # checked when given
    chunked: bool = False  # sent without a Content-Length


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "prompt": "Hello", **fields}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": MESSAGES, **fields}


CASES = [
    # Not JSON, or not an object.
    Case("truncated-json", COMPLETIONS, b'{"prompt": "Hello",', message="not valid JSON"),
    Case("not-json", COMPLETIONS, b"prompt=Hello", message="not valid JSON"),
    Case("empty-body", COMPLETIONS, b""),
    Case("json-array", COMPLETIONS, b"[1, 2]"),
    Case("json-null", CHAT, b"null"),
    # Missing fields.
    Case("no-prompt", COMPLETIONS, {"model": MODEL_NAME}, param="prompt"),
    Case("no-messages", CHAT, {"model": MODEL_NAME}, param="messages"),
    Case("no-tokens", "/detokenize", {}, param="tokens"),
    Case("tokenize-nothing", "/tokenize", {}, param="prompt"),
    # Wrong types.
    Case("max-tokens-string", COMPLETIONS, completion(max_tokens="ten"), param="max_tokens"),
    Case("max-tokens-fraction", COMPLETIONS, completion(max_tokens=1.5), param="max_tokens"),
    Case("temperature-string", COMPLETIONS, completion(temperature="hot"), param="temperature"),
    Case("prompt-number", COMPLETIONS, completion(prompt=5)),
    Case("prompt-mixed-lists", COMPLETIONS, completion(prompt=[[1, 2], ["a"]])),
    Case("messages-string", CHAT, chat(messages="Hello"), param="messages"),
    Case("message-null", CHAT, chat(messages=[None]), param="messages.0"),
    Case("message-no-role", CHAT, chat(messages=[{"content": "hi"}]), param="messages.0.role"),
    Case("role-unknown", CHAT, chat(messages=[{"role": "robot", "content": "hi"}])),
    Case("content-number", CHAT, chat(messages=[{"role": "user", "content": 5}])),
    Case(
        "stream-options-number",
        COMPLETIONS,
        completion(stream=True, stream_options=5),
        param="stream_options",
    ),
    Case("tokens-string", "/detokenize", {"tokens": "abc"}, param="tokens"),
    # Options of a stream without one (OpenAI's 400, and vLLM's).
    Case(
        "stream-options-unstreamed",
        CHAT,
        chat(stream_options={"include_usage": True}),
        param="stream_options",
    ),
    Case(
        "stream-options-stream-false",
        COMPLETIONS,
        completion(stream=False, stream_options={"include_usage": True}),
        param="stream_options",
    ),
    # Out of range.
    Case("max-tokens-negative", COMPLETIONS, completion(max_tokens=-1), param="max_tokens"),
    Case("max-tokens-zero", CHAT, chat(max_tokens=0), param="max_tokens"),
    Case(
        "max-completion-tokens-negative",
        CHAT,
        chat(max_completion_tokens=-5),
        param="max_completion_tokens",
    ),
    Case("temperature-negative", COMPLETIONS, completion(temperature=-1), param="temperature"),
    Case("temperature-3", CHAT, chat(temperature=3), param="temperature"),
    Case("temperature-nan", COMPLETIONS, b'{"prompt": "Hello", "temperature": NaN}'),
    Case("top-p-2", COMPLETIONS, completion(top_p=2), param="top_p"),
    Case("top-p-0", CHAT, chat(top_p=0), param="top_p"),
    Case("top-k-minus-2", COMPLETIONS, completion(top_k=-2), param="top_k"),
    Case("top-k-huge", COMPLETIONS, completion(top_k=2**70), param="top_k"),
    Case("min-p-1.5", COMPLETIONS, completion(min_p=1.5), param="min_p"),
    Case("seed-negative", COMPLETIONS, completion(seed=-1), param="seed"),
    Case("seed-huge", COMPLETIONS, completion(seed=2**70), param="seed"),
    Case("n-huge", COMPLETIONS, completion(n=1_000_000), param="n"),
    Case("frequency-penalty-5", CHAT, chat(frequency_penalty=5), param="frequency_penalty"),
    Case("token-id-negative", COMPLETIONS, completion(prompt=[-1]), param="prompt"),
    Case("token-id-beyond-vocab", COMPLETIONS, completion(prompt=[100_000]), param="prompt"),
    Case("detokenize-beyond-vocab", "/detokenize", {"tokens": [10**30]}, param="tokens"),
    # Empty.
    Case("prompt-empty-string", COMPLETIONS, completion(prompt=""), param="prompt"),
    Case("prompt-empty-list", COMPLETIONS, completion(prompt=[]), param="prompt"),
    Case("prompt-list-with-empty-string", COMPLETIONS, completion(prompt=["a", ""])),
    Case("prompt-empty-token-list", COMPLETIONS, completion(prompt=[[]]), param="prompt"),
    Case("messages-empty", CHAT, chat(messages=[]), param="messages"),
    # Too long for the context.
    Case(
        "prompt-overlong",
        COMPLETIONS,
        completion(prompt=LONG_TEXT),
        message="maximum context length",
        code="context_length_exceeded",
    ),
    Case(
        "token-prompt-overlong",
        COMPLETIONS,
        completion(prompt=[5] * 600),
        message="maximum context length",
    ),
    Case(
        "chat-overlong",
        CHAT,
        chat(messages=[{"role": "user", "content": LONG_TEXT}]),
        message="maximum context length",
    ),
    Case(
        "max-tokens-over-context",
        COMPLETIONS,
        completion(max_tokens=100_000),
        message="maximum context length",
        param="max_tokens",
    ),
    Case(
        "max-completion-tokens-over-context",
        CHAT,
        chat(max_completion_tokens=10**6),
        message="maximum context length",
    ),
    # Unknown model.
    Case(
        "unknown-model",
        COMPLETIONS,
        completion(model="gpt-4"),
        404,
        "model",
        code="model_not_found",
    ),
    Case("unknown-model-chat", CHAT, chat(model="nope"), 404, "model", code="model_not_found"),
    Case(
        "unknown-model-surrogate",
        COMPLETIONS,
        b'{"model": "\\ud800", "prompt": "Hello"}',
        404,
        "model",
        code="model_not_found",
    ),
    # Lone surrogates in the JSON text.
    Case("surrogate-prompt", COMPLETIONS, b'{"prompt": "\\ud800"}', param="prompt"),
    Case("surrogate-prompt-list", COMPLETIONS, b'{"prompt": ["ok", "x \\udfff"]}', param="prompt"),
    Case(
        "surrogate-chat",
        CHAT,
        b'{"messages": [{"role": "user", "content": "hi \\ud83d"}]}',
        param="messages.0.content",
    ),
    Case(
        "surrogate-text-part",
        CHAT,
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
        param="messages.0.content",
    ),
    Case("surrogate-tokenize", "/tokenize", b'{"prompt": "\\ud800"}', param="prompt"),
    Case("surrogate-key", COMPLETIONS, b'{"prompt": "Hello", "logit_bias": {"\\ud800": "x"}}'),
    # Supported parameters out of their range.
    Case("stop-too-many", COMPLETIONS, completion(stop=[str(i) for i in range(17)]), param="stop"),
    Case("stop-number", CHAT, chat(stop=5), message="stop"),
    Case("stop-token-out-of-vocab", CHAT, chat(stop_token_ids=[10**9]), param="stop_token_ids"),
    Case("min-tokens-over-max", COMPLETIONS, completion(min_tokens=20), param="min_tokens"),
    Case("presence-penalty-3", CHAT, chat(presence_penalty=3), param="presence_penalty"),
    Case("repetition-penalty-0", CHAT, chat(repetition_penalty=0), param="repetition_penalty"),
    Case("logit-bias-200", COMPLETIONS, completion(logit_bias={"5": 200}), param="logit_bias"),
    Case("logit-bias-key", COMPLETIONS, completion(logit_bias={"abc": 1}), param="logit_bias"),
    Case(
        "logit-bias-out-of-vocab",
        CHAT,
        chat(logit_bias={"99999999": 1}),
        param="logit_bias",
        message="vocabulary",
    ),
    Case("logprobs-21", COMPLETIONS, completion(logprobs=21), param="logprobs"),
    Case("top-logprobs-21", CHAT, chat(logprobs=True, top_logprobs=21), param="top_logprobs"),
    Case("top-logprobs-alone", CHAT, chat(top_logprobs=3), param="top_logprobs"),
    # Parameters we do not support yet are refused by name.
    Case("n-129", CHAT, chat(n=129), param="n"),
    Case("best-of", COMPLETIONS, completion(best_of=3), param="best_of", message="best_of"),
    Case("suffix", COMPLETIONS, completion(suffix="x"), param="suffix"),
    Case(
        "response-format-xml", CHAT, chat(response_format={"type": "xml"}), param="response_format"
    ),
    Case(
        "response-format-no-schema",
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        param="response_format",
    ),
    Case(
        "response-format-bad-schema",
        COMPLETIONS,
        completion(
            stream=True,
            response_format={"type": "json_schema", "json_schema": {"schema": {"type": "bogus"}}},
        ),
        param="response_format",
    ),
    # Tools: "auto" (the default with tools) needs --enable-auto-tool-choice.
    Case(
        "tools-auto-not-enabled",
        CHAT,
        chat(tools=TOOLS),
        param="tool_choice",
        message="--enable-auto-tool-choice",
    ),
    Case("tool-choice-without-tools", CHAT, chat(tool_choice="required"), param="tool_choice"),
    Case("functions", CHAT, chat(functions=[{"name": "f"}]), param="functions"),
    Case("tools-same-name", CHAT, chat(tools=TOOLS * 2, tool_choice="none"), param="tools"),
    Case(
        "tool-choice-unknown-function",
        CHAT,
        chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "g"}}),
        param="tool_choice",
        message="'g'",
    ),
    Case("tool-choice-bogus", CHAT, chat(tools=TOOLS, tool_choice="always"), param="tool_choice"),
    Case(
        "tool-not-function",
        CHAT,
        chat(tools=[{"type": "retrieval", "function": {"name": "f"}}], tool_choice="required"),
        param="tools.0.type",
    ),
    Case(
        "tool-no-name",
        CHAT,
        chat(tools=[{"type": "function", "function": {}}], tool_choice="required"),
        param="tools.0.function.name",
    ),
    Case(
        "tool-parameters-not-object",
        CHAT,
        chat(
            tools=[
                {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
            ],
            tool_choice="required",
        ),
        param="tools.0.function.parameters",
    ),
    Case(
        "tool-message-without-id",
        CHAT,
        chat(messages=[*MESSAGES, {"role": "tool", "content": "42"}]),
        param="messages.1",
    ),
    Case(
        "tool-call-arguments-not-json",
        CHAT,
        chat(
            messages=[
                *MESSAGES,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}
                    ],
                },
            ]
        ),
        param="messages.1.tool_calls",
    ),
    Case(
        "image-part",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
    ),
    # Too big.
    Case("body-10mb", COMPLETIONS, b"x" * (10 * 1024 * 1024), 413, code="request_too_large"),
    Case(
        "body-10mb-json",
        COMPLETIONS,
        json.dumps(completion(prompt="a " * (5 * 1024 * 1024))).encode(),
        413,
    ),
    Case(
        "body-10mb-chunked",
        COMPLETIONS,
        json.dumps(completion(prompt="a " * (5 * 1024 * 1024))).encode(),
        413,
        chunked=True,
    ),
    # Routes and methods.
    Case("no-such-route", "/v1/no-such-route", completion(), 404),
]


def send(http: httpx.Client, case: Case) -> httpx.Response:
    data = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
    content: bytes | Iterator[bytes] = data
    if case.chunked:
        step = 64 * 1024
        content = (data[i : i + step] for i in range(0, len(data), step))
    return http.post(case.path, content=content, headers={"Content-Type": "application/json"})


def check_error_shape(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return check_error_body(response.json())


@pytest.fixture(scope="module")
def http(server: LiveServer):
    with server.client() as client:
        yield client


def test_there_are_enough_cases():
    assert len(CASES) >= 30
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_request(http: httpx.Client, server: LiveServer, case: Case):
    error = check_error_shape(send(http, case), case.status)
    if case.param is not None:
        assert error["param"] == case.param, error
    if case.message is not None:
        assert case.message in error["message"], error
    if case.code is not None:
        assert error["code"] == case.code, error
    assert "Value error" not in error["message"], error  # (pydantic's own words)
    assert not server.state.is_dead


def test_wrong_method(http: httpx.Client):
    check_error_shape(http.get(COMPLETIONS), 405)


def test_still_serving_after_bad_input(http: httpx.Client, server: LiveServer):
    for case in CASES:  # all again, back to back
        assert send(http, case).status_code < 500
    assert http.get("/healthz").status_code == 200
    assert http.get("/readyz").status_code == 200
    out = http.post(COMPLETIONS, json=completion(max_tokens=5, ignore_eos=True))
    assert out.status_code == 200
    assert out.json()["usage"]["completion_tokens"] == 5
    assert server.state.engine.num_pending == 0
    assert server.engine.memory_stats()["used_blocks"] == 0
