"""Inputs of the kind that have taken inference servers down: huge counts and lists,
oversized headers, deeply nested JSON, megabyte strings, control characters and lone
surrogates in every string field, hostile JSON schemas, malformed messages, and a
server whose whole KV cache is one prompt.

Each case gets a fast answer (a 4xx in OpenAI's error shape where the input is bad)
and, after it, the server still serves a normal request, with nothing left pending and
no KV block held. test_bad_input.py has the plainer malformed bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.server.app import build_app
from hetero_infer.server.settings import ServerSettings

from tests.server.conftest import (
    MAX_MODEL_LEN,
    MODEL_NAME,
    LiveServer,
    make_engine,
    start_server,
    wait_until,
)
from tests.server.gauges import gauges
from tests.server.test_bad_input import (
    CHAT,
    COMPLETIONS,
    MESSAGES,
    Case,
    chat,
    check_error_shape,
    completion,
    send,
)

# Every answer within this: generous for a shared 2-core machine, far below a hang.
MAX_SECONDS = 5.0
# Where a case is served (a string the server may accept), a short answer.
SHORT = {"max_tokens": 2}


def json_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def tool(parameters: dict[str, Any], name: str = "f", description: str = "") -> dict[str, Any]:
    function = {"name": name, "description": description, "parameters": parameters}
    return {"type": "function", "function": function}


def nested_schema(levels: int) -> dict[str, Any]:
    """An object schema ``levels`` objects deep (each level nests the body 2 deeper)."""
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(levels - 1):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def nested_list(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def deep_json(field: bytes, depth: int) -> bytes:
    """A completions body whose ``field`` is ``depth`` nested arrays, as raw JSON (too
    deep for Python's json module to build)."""
    return b'{"prompt": "Hello", "' + field + b'": ' + b"[" * depth + b"]" * depth + b"}"


LONG = "x" * 1_000_000  # a megabyte: under the 4 MiB body limit, over any sane field
CONTROL = "a\x00b\x1b[31m\x7f\u202e\r\n\x08c"
SURROGATE = "a\ud800b"  # json.dumps writes it as the escape "\ud800", as an attacker would

# One request per string field, with the value placed in it.
STRING_FIELDS = {
    "model": lambda s: chat(model=s, **SHORT),
    "user": lambda s: chat(user=s, **SHORT),
    "role": lambda s: chat(messages=[{"role": s, "content": "hi"}], **SHORT),
    "name": lambda s: chat(messages=[{"role": "user", "name": s, "content": "hi"}], **SHORT),
    "content": lambda s: chat(messages=[{"role": "user", "content": s}], **SHORT),
    "text-part": lambda s: chat(
        messages=[{"role": "user", "content": [{"type": "text", "text": s}]}], **SHORT
    ),
    "stop": lambda s: chat(stop=[s], **SHORT),
    "tool-description": lambda s: chat(
        tools=[tool({"type": "object"}, description=s)], tool_choice="none", **SHORT
    ),
    "tool-call-id": lambda s: chat(
        messages=[
            *MESSAGES,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": s, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": s, "content": "42"},
        ],
        **SHORT,
    ),
    "schema-name": lambda s: chat(
        response_format={"type": "json_schema", "json_schema": {"name": s, "schema": {}}},
        **SHORT,
    ),
}
# field -> the status for (a megabyte, control characters, a lone surrogate). Strings the
# server only echoes or ignores are served (the test model's chat template writes only
# roles and content); text a chat template may write into the prompt must be valid
# Unicode, and the prompt must fit the context.
STRING_STATUS = {
    "model": (404, 404, 404),
    "user": (200, 200, 200),
    "role": (400, 400, 400),
    "name": (200, 200, 400),
    "content": (400, 200, 400),
    "text-part": (400, 200, 400),
    "stop": (400, 200, 200),
    "tool-description": (200, 200, 400),
    "tool-call-id": (200, 200, 400),
    "schema-name": (200, 200, 200),
}

STRING_CASES = [
    Case(f"{kind}-{field}", CHAT, build(value), status)
    for field, build in STRING_FIELDS.items()
    for kind, value, status in zip(
        ("long", "control", "surrogate"),
        (LONG, CONTROL, SURROGATE),
        STRING_STATUS[field],
        strict=True,
    )
]

CASES = [
    # Counts and ranges far beyond the limits.
    Case("n-huge-chat", CHAT, chat(n=10**6), param="n"),
    Case("best-of-huge", COMPLETIONS, completion(best_of=10**6), param="best_of"),
    Case(
        "max-tokens-huge",
        CHAT,
        chat(max_tokens=10**6),
        param="max_tokens",
        code="context_length_exceeded",
    ),
    Case("max-tokens-2**70", COMPLETIONS, completion(max_tokens=2**70), param="max_tokens"),
    Case("logprobs-negative", COMPLETIONS, completion(logprobs=-1), param="logprobs"),
    Case(
        "top-logprobs-negative",
        CHAT,
        chat(logprobs=True, top_logprobs=-1),
        param="top_logprobs",
    ),
    Case(
        "top-logprobs-huge",
        CHAT,
        chat(logprobs=True, top_logprobs=10**6),
        param="top_logprobs",
    ),
    # Lists and maps of thousands of entries.
    Case("stop-5000", CHAT, chat(stop=[f"s{i}" for i in range(5000)]), param="stop"),
    Case("stop-100k-chars", COMPLETIONS, completion(stop=["x" * 100_000]), param="stop"),
    Case(
        "logit-bias-5000",
        COMPLETIONS,
        completion(logit_bias={str(i): 1 for i in range(5000)}),
        param="logit_bias",
    ),
    Case("logit-bias-5000-digit-key", CHAT, chat(logit_bias={"9" * 5000: 1}), param="logit_bias"),
    Case(
        "stop-token-ids-5000",
        CHAT,
        chat(stop_token_ids=list(range(5000))),
        param="stop_token_ids",
    ),
    Case("stop-token-id-negative", CHAT, chat(stop_token_ids=[-1]), param="stop_token_ids"),
    Case(
        "stop-token-id-2**70",
        COMPLETIONS,
        completion(stop_token_ids=[2**70]),
        param="stop_token_ids",
    ),
    Case(
        "prompt-1M-token-ids",
        COMPLETIONS,
        completion(prompt=[5] * 1_000_000),
        code="context_length_exceeded",
    ),
    Case(
        "stream-logit-bias-5000",
        CHAT,
        chat(stream=True, logit_bias={str(i): 1 for i in range(5000)}),
        param="logit_bias",
    ),
    Case(
        "messages-20000",
        CHAT,
        chat(messages=[{"role": "user", "content": "a"}] * 20_000),
        param="messages",
    ),
    # Nesting: past Python's json parser, and past the body's depth limit.
    Case("json-100k-deep-array", COMPLETIONS, deep_json(b"extra", 100_000)),
    Case(
        "json-100k-deep-object",
        CHAT,
        b'{"messages": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}",
    ),
    Case(
        "schema-100-objects-deep",
        CHAT,
        chat(response_format=json_format(nested_schema(100))),
        message="nests",
    ),
    Case(
        "tool-parameters-100-objects-deep",
        CHAT,
        chat(tools=[tool(nested_schema(100))], tool_choice="required"),
        message="nests",
    ),
    Case(
        "template-kwargs-500-deep",
        CHAT,
        chat(chat_template_kwargs={"x": nested_list(500)}),
        message="nests",
    ),
    Case("unknown-field-600-deep", COMPLETIONS, deep_json(b"extra", 600), message="nests"),
    # A template's variables are the template's text: valid Unicode on every route
    # that templates messages.
    *(
        Case(f"surrogate-template-kwargs-{path}", path, body, param="chat_template_kwargs")
        for path, body in [
            (CHAT, chat(chat_template_kwargs={"k": SURROGATE})),
            ("/tokenize", {"messages": MESSAGES, "chat_template_kwargs": {"k": SURROGATE}}),
            ("/v1/embeddings", {"messages": MESSAGES, "chat_template_kwargs": {SURROGATE: 1}}),
        ]
    ),
    # Hostile JSON schemas: a clear 400, or a grammar built (and run) in bounded time.
    Case(
        "schema-catastrophic-regex",
        CHAT,
        chat(
            response_format=json_format(
                {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}
            ),
            **SHORT,
        ),
        200,
    ),
    Case(
        "schema-exponential-regex",
        CHAT,
        chat(
            response_format=json_format({"type": "string", "pattern": "^(.*a.{40}b)+$"}),
            **SHORT,
        ),
        200,
    ),
    Case(
        "schema-enum-100k",
        CHAT,
        chat(response_format=json_format({"enum": [f"value {i}" for i in range(100_000)]})),
        400,
    ),
    Case(
        "schema-ref-loop",
        CHAT,
        chat(response_format=json_format({"$ref": "#"}), **SHORT),
        400,
    ),
    Case(
        "schema-ref-cycle",
        CHAT,
        chat(
            response_format=json_format(
                {
                    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                    "$ref": "#/$defs/a",
                }
            ),
            **SHORT,
        ),
        400,
    ),
    Case(
        "schema-unsupported-keyword",
        CHAT,
        chat(response_format=json_format({"type": "string", "if": {}, "then": {}}), **SHORT),
        400,
    ),
    Case(
        "schema-not-keyword",
        CHAT,
        chat(response_format=json_format({"not": {"type": "string"}}), **SHORT),
        400,
        message="not",
    ),
    Case(
        "schema-empty-enum",
        CHAT,
        chat(response_format=json_format({"enum": []}), **SHORT),
        400,
        message="Unsatisfiable",
    ),
    Case(
        "tool-schema-ref-loop",
        CHAT,
        chat(tools=[tool({"type": "object", "$ref": "#"})], tool_choice="required", **SHORT),
        400,
    ),
    # Malformed messages (an unknown role and an empty list are in test_bad_input.py; the
    # served one is the positive control).
    Case(
        "user-message-without-content", CHAT, chat(messages=[{"role": "user"}]), param="messages.0"
    ),
    Case(
        "user-message-null-content",
        CHAT,
        chat(messages=[{"role": "user", "content": None}]),
        param="messages.0",
    ),
    Case(
        "assistant-message-without-content-or-calls",
        CHAT,
        chat(messages=[*MESSAGES, {"role": "assistant"}]),
        param="messages.1",
    ),
    Case(
        "assistant-calls-with-null-content",
        CHAT,
        STRING_FIELDS["tool-call-id"]("call-1"),
        200,
    ),
    Case(
        "content-part-unknown-type",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "hologram", "text": "hi"}]}]),
    ),
    Case(
        "content-part-not-an-object",
        CHAT,
        chat(messages=[{"role": "user", "content": ["hi"]}]),
    ),
    *STRING_CASES,
]


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def check_still_serving(http: httpx.Client, server: LiveServer) -> None:
    """A normal request is served, and then nothing is pending and no KV block held."""
    out = http.post(COMPLETIONS, json=completion(max_tokens=3, ignore_eos=True))
    assert out.status_code == 200, out.text
    assert out.json()["usage"]["completion_tokens"] == 3
    assert not server.state.is_dead
    assert server.state.engine.num_pending == 0
    assert gauges(http)["kv_cache_usage_perc"] == 0


def test_the_cases_are_distinct():
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_abusive_request(http: httpx.Client, server: LiveServer, case: Case):
    started = time.monotonic()
    response = send(http, case)
    elapsed = time.monotonic() - started
    if case.status == 200:
        assert response.status_code == 200, response.text
    else:
        error = check_error_shape(response, case.status)
        if case.param is not None:
            assert error["param"] == case.param, error
        if case.message is not None:
            assert case.message in error["message"], error
        if case.code is not None:
            assert error["code"] == case.code, error
        assert len(error["message"]) < 2000, "a message echoes the whole input"
    assert elapsed < MAX_SECONDS, f"{case.id} took {elapsed:.1f} s"
    check_still_serving(http, server)


# ---- HTTP below the app: headers ----


def exchange(server: LiveServer, head: bytes) -> tuple[int, float]:
    """Send a raw request head (and nothing more); the status line's code and the
    seconds to it. The server may close the connection as soon as it has answered."""
    port = int(server.url.rsplit(":", 1)[1])
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=MAX_SECONDS) as sock:
        with contextlib.suppress(OSError):  # closed on us mid-send: still read the answer
            sock.sendall(head)
        received = b""
        while b"\r\n" not in received:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
    elapsed = time.monotonic() - started
    assert received.startswith(b"HTTP/1.1 "), received[:200]
    return int(received.split()[1]), elapsed


def request_head(headers: list[tuple[str, str]]) -> bytes:
    lines = ["GET /healthz HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([("X-Big", "a" * 100_000)], id="one-100kb-header"),
        pytest.param([(f"X-H{i}", "v" * 20) for i in range(10_000)], id="10000-headers"),
        pytest.param([(f"X-H{i}", "v") for i in range(300)], id="300-small-headers"),
    ],
)
def test_oversized_headers_are_refused_at_once(
    server: LiveServer, http: httpx.Client, headers: list[tuple[str, str]]
):
    status, elapsed = exchange(server, request_head(headers))
    assert status in (400, 431)
    assert elapsed < MAX_SECONDS
    check_still_serving(http, server)


def test_headers_within_the_limits_are_served(server: LiveServer):
    status, _ = exchange(server, request_head([(f"X-H{i}", "v") for i in range(100)]))
    assert status == 200


# ---- a KV cache that holds exactly one full-length sequence ----


@pytest.fixture(scope="module")
def one_sequence_server(model_dir: Path) -> Iterator[LiveServer]:
    """max_model_len tokens of KV cache: one prompt can take all of it."""
    engine = make_engine(model_dir, max_num_blocks=MAX_MODEL_LEN // 16)
    live = start_server(model_dir, engine=engine)
    yield live
    live.stop()


def test_prompts_that_fill_the_whole_cache(one_sequence_server: LiveServer):
    """A prompt longer than the whole cache is refused (it is longer than the context
    too: the engine does not start with a cache smaller than one context, as vLLM); two
    that each fill it take turns, neither waits forever; nothing stays held."""
    server = one_sequence_server
    assert server.engine.memory_stats()["total_blocks"] * 16 == MAX_MODEL_LEN
    with server.client() as http:
        error = check_error_shape(
            http.post(COMPLETIONS, json=completion(prompt=[5] * (MAX_MODEL_LEN + 1))), 400
        )
        assert error["code"] == "context_length_exceeded"

    body = completion(prompt=[7] * 300, max_tokens=MAX_MODEL_LEN - 300, ignore_eos=True)

    async def two_at_once() -> list[httpx.Response]:
        async with server.async_client(timeout=120) as client:
            return await asyncio.gather(*(client.post(COMPLETIONS, json=body) for _ in range(2)))

    for response in asyncio.run(two_at_once()):
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == MAX_MODEL_LEN - 300
    with server.client() as http:
        wait_until(lambda: gauges(http)["kv_cache_usage_perc"] == 0, 10, "the blocks to free")
    assert server.state.engine.num_pending == 0


def test_a_cache_smaller_than_the_context_stops_the_start(model_dir: Path):
    """As vLLM: a KV cache that cannot hold one max_model_len sequence is a startup
    error, not a request that waits forever; the server says so on every route."""
    config = EngineConfig(model=str(model_dir), max_model_len=MAX_MODEL_LEN, max_num_blocks=8)
    app = build_app(ServerSettings(engine=config, served_model_name=MODEL_NAME))
    with TestClient(app) as client:
        wait_until(lambda: app.state.server.is_dead, 60, "the engine to fail to load")
        assert "fewer than max_model_len" in str(app.state.server.load_error)
        assert client.get("/readyz").status_code == 503
        response = client.post(COMPLETIONS, json=completion())
        error = check_error_shape(response, 503)
        assert "failed" in error["message"]
        assert response.headers["retry-after"]
