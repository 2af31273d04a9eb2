"""test_abuse.py's inputs on the Responses API, Anthropic's and Ollama's routes: JSON
nested past the body's limit, megabyte strings, lists and maps of thousands of
entries, numbers past any bound, lone surrogates, names a megabyte long.

Each case gets a fast answer, a 4xx in the route's own error shape (OpenAI's on
/v1/responses, Anthropic's on /v1/messages*, Ollama's on /api/*) or a 200 where the
input is fine; after it the same route still serves a normal request, with nothing
left pending and no KV block held. test_abuse_constraints.py has the hostile schemas,
regexes and grammars.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, LiveServer
from tests.server.gauges import gauges
from tests.server.route_shapes import error_message

# Every answer within this: generous for a shared 2-core machine, far below a hang.
MAX_SECONDS = 5.0
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
OLLAMA_CHAT = "/api/chat"
OLLAMA_GENERATE = "/api/generate"
OLLAMA_EMBED = "/api/embed"
OLLAMA_SHOW = "/api/show"
HELLO = [{"role": "user", "content": "Hello"}]


# Short, valid requests on each route; a case puts its abuse over one of them.
def completions(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2, **fields}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": HELLO, "max_tokens": 2, **fields}


def responses(**fields: Any) -> dict[str, Any]:
    # Not stored: the store would keep the cases' bodies.
    return {"model": MODEL_NAME, "input": "Hello", "max_output_tokens": 2, "store": False, **fields}


def messages(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "max_tokens": 2, "messages": HELLO, **fields}


def count_tokens(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": HELLO, **fields}


def ollama_chat(**fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "messages": HELLO,
        "stream": False,
        "options": {"num_predict": 2},
        **fields,
    }


def ollama_generate(**fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "prompt": "Hello",
        "stream": False,
        "options": {"num_predict": 2},
        **fields,
    }


def ollama_embed(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "input": "Hello", **fields}


# The other families' generation routes streamed, with a budget of output tokens in each
# family's own field.
STREAMED = {
    RESPONSES: lambda tokens: responses(stream=True, max_output_tokens=tokens),
    MESSAGES: lambda tokens: messages(stream=True, max_tokens=tokens),
    OLLAMA_CHAT: lambda tokens: ollama_chat(stream=True, options={"num_predict": tokens}),
    OLLAMA_GENERATE: lambda tokens: ollama_generate(stream=True, options={"num_predict": tokens}),
}

BUILDERS = {
    COMPLETIONS: completions,
    CHAT: chat,
    RESPONSES: responses,
    MESSAGES: messages,
    COUNT_TOKENS: count_tokens,
    OLLAMA_CHAT: ollama_chat,
    OLLAMA_GENERATE: ollama_generate,
    OLLAMA_EMBED: ollama_embed,
    OLLAMA_SHOW: lambda **fields: {"model": MODEL_NAME, **fields},
}


@dataclass
class Abuse:
    id: str
    path: str
    body: dict[str, Any] | bytes  # bytes go out as they are, as JSON
    status: int = 400
    message: str | None = None  # a substring of the error's message, checked when given


def send(http: httpx.Client, path: str, body: dict[str, Any] | bytes) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post(path, content=data, headers={"Content-Type": "application/json"})


def check_still_serving(http: httpx.Client, server: LiveServer, path: str) -> None:
    """The route serves a normal request, and then nothing is pending and no KV block
    is held."""
    response = send(http, path, BUILDERS[path]())
    assert response.status_code == 200, response.text
    assert not server.state.is_dead
    assert server.state.engine.num_pending == 0
    assert gauges(http)["kv_cache_usage_perc"] == 0


def check_abuse(http: httpx.Client, server: LiveServer, case: Abuse) -> None:
    """The case's answer: its status, fast, a 4xx in the route's shape with a message
    that does not echo the input; then the route still serves."""
    started = time.monotonic()
    response = send(http, case.path, case.body)
    elapsed = time.monotonic() - started
    assert response.status_code == case.status, response.text[:2000]
    if case.status >= 400:
        message = error_message(case.path, response.json())
        if case.message is not None:
            assert case.message in message, message
        assert len(message) < 2000, "a message echoes the whole input"
    assert elapsed < MAX_SECONDS, f"{case.id} took {elapsed:.1f} s"
    check_still_serving(http, server, case.path)


def deep_body(path: str, depth: int, of: str = "arrays") -> bytes:
    """A valid body of ``path`` with a field ``x`` of ``depth`` nested arrays (or
    objects), as raw JSON (too deep for Python's json module to build)."""
    opening, closing = (b"[", b"]") if of == "arrays" else (b'{"a": ', b"}")
    head = json.dumps(BUILDERS[path]())[:-1].encode()
    return head + b', "x": ' + opening * depth + b"1" + closing * depth + b"}"


def ollama_call(arguments: dict[str, Any], name: str = "f") -> dict[str, Any]:
    """An Ollama conversation with an earlier tool call and its result."""
    call = {"function": {"name": name, "arguments": arguments}}
    return ollama_chat(
        messages=[
            *HELLO,
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_name": "f", "content": "42"},
        ]
    )


def responses_call(arguments: str, name: str = "f") -> dict[str, Any]:
    """A Responses API conversation with an earlier function call and its output."""
    call = {"type": "function_call", "call_id": "c1", "name": name, "arguments": arguments}
    output = {"type": "function_call_output", "call_id": "c1", "output": "42"}
    return responses(input=[*HELLO, call, output])


LONG = "x" * 1_000_000  # a megabyte: under the 4 MiB body limit, over any sane field
SURROGATE_CONTENT = '[{"role": "user", "content": "a\\ud800b"}]'
NEW_ROUTES = [
    RESPONSES,
    MESSAGES,
    COUNT_TOKENS,
    OLLAMA_CHAT,
    OLLAMA_GENERATE,
    OLLAMA_EMBED,
    OLLAMA_SHOW,
]
# The field of each route that holds the conversation or the text, for the cases that
# put something into it.
PROMPTS = {
    RESPONSES: lambda value: responses(input=value),
    MESSAGES: lambda value: messages(messages=[{"role": "user", "content": value}]),
    COUNT_TOKENS: lambda value: count_tokens(messages=[{"role": "user", "content": value}]),
    OLLAMA_CHAT: lambda value: ollama_chat(messages=[{"role": "user", "content": value}]),
    OLLAMA_GENERATE: lambda value: ollama_generate(prompt=value),
    OLLAMA_EMBED: lambda value: ollama_embed(input=value, truncate=False),
}

CASES = [
    # Nesting: past Python's json parser, and past the body's depth limit.
    *(Abuse(f"json-100k-deep-array-{path}", path, deep_body(path, 100_000)) for path in NEW_ROUTES),
    *(
        Abuse(f"json-100k-deep-object-{path}", path, deep_body(path, 100_000, "objects"))
        for path in NEW_ROUTES
    ),
    *(
        Abuse(f"json-600-deep-{path}", path, deep_body(path, 600), message="nests")
        for path in NEW_ROUTES
    ),
    # Megabyte texts: longer than the context; lone surrogates: no tokenizer takes them.
    *(
        Abuse(f"long-text-{path}", path, build(LONG))
        for path, build in PROMPTS.items()
        if path != COUNT_TOKENS
    ),
    # Counting a megabyte's tokens is fine (and fast): only generating needs a context.
    Abuse("long-text-count-tokens", COUNT_TOKENS, PROMPTS[COUNT_TOKENS](LONG), 200),
    *(Abuse(f"surrogate-text-{path}", path, build("a\ud800b")) for path, build in PROMPTS.items()),
    # Megabyte model names: a 404 that does not echo them whole.
    *(Abuse(f"long-model-{path}", path, BUILDERS[path](model=LONG), 404) for path in NEW_ROUTES),
    # Lists of thousands of entries.
    Abuse("responses-input-20000-items", RESPONSES, responses(input=HELLO * 20_000)),
    Abuse(
        "responses-metadata-5000", RESPONSES, responses(metadata={str(i): "v" for i in range(5000)})
    ),
    Abuse("messages-20000-turns", MESSAGES, messages(messages=HELLO * 20_000)),
    Abuse("count-tokens-20000-turns", COUNT_TOKENS, count_tokens(messages=HELLO * 20_000), 200),
    Abuse("messages-stop-5000", MESSAGES, messages(stop_sequences=[f"s{i}" for i in range(5000)])),
    Abuse("messages-stop-100k-chars", MESSAGES, messages(stop_sequences=["x" * 100_000])),
    Abuse("ollama-chat-20000-messages", OLLAMA_CHAT, ollama_chat(messages=HELLO * 20_000)),
    Abuse(
        "ollama-stop-5000",
        OLLAMA_GENERATE,
        ollama_generate(options={"stop": [f"s{i}" for i in range(5000)]}),
    ),
    Abuse("ollama-context-1M-token-ids", OLLAMA_GENERATE, ollama_generate(context=[5] * 1_000_000)),
    Abuse("ollama-embed-20000-inputs", OLLAMA_EMBED, ollama_embed(input=["a"] * 20_000)),
    Abuse(
        "ollama-options-5000-unknown",
        OLLAMA_CHAT,
        ollama_chat(options={f"o{i}": 1 for i in range(5000)}),
    ),
    # Numbers past any bound.
    Abuse("messages-max-tokens-2**70", MESSAGES, messages(max_tokens=2**70)),
    Abuse("messages-top-k-2**70", MESSAGES, messages(top_k=2**70)),
    Abuse("responses-max-output-tokens-2**70", RESPONSES, responses(max_output_tokens=2**70)),
    # Clamped to what the context leaves, as Ollama does.
    Abuse(
        "ollama-num-predict-2**70",
        OLLAMA_GENERATE,
        ollama_generate(options={"num_predict": 2**70}),
        200,
    ),
    Abuse("ollama-top-k-2**70", OLLAMA_CHAT, ollama_chat(options={"top_k": 2**70})),
    Abuse("ollama-seed-2**70", OLLAMA_CHAT, ollama_chat(options={"seed": 2**70})),
    Abuse("ollama-context-token-2**70", OLLAMA_GENERATE, ollama_generate(context=[2**70])),
    Abuse("ollama-top-logprobs-10**6", OLLAMA_CHAT, ollama_chat(logprobs=True, top_logprobs=10**6)),
    # Malformed conversations.
    Abuse(
        "messages-tool-use-surrogate-input",
        MESSAGES,
        messages(
            messages=[
                *HELLO,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": "\ud800"}}
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}],
                },
            ]
        ),
    ),
    # Arguments reach the template as JSON text, its escapes ASCII: nothing to refuse.
    Abuse("ollama-tool-call-surrogate-arguments", OLLAMA_CHAT, ollama_call({"a": "\ud800"}), 200),
    Abuse("ollama-tool-call-surrogate-name", OLLAMA_CHAT, ollama_call({}, name="f\ud800")),
    Abuse("responses-call-surrogate-arguments", RESPONSES, responses_call('{"a": "\ud800"}')),
    Abuse("responses-call-surrogate-name", RESPONSES, responses_call("{}", name="f\ud800")),
]


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def test_the_cases_are_distinct():
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_abusive_request(http: httpx.Client, server: LiveServer, case: Abuse):
    check_abuse(http, server, case)
