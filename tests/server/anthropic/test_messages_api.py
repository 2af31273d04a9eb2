"""/v1/messages and /v1/messages/count_tokens through the official `anthropic` client
against a live server on the real engine (a tiny random Llama, the hermes-style
template of the tool tests, an API key).

A random model writes garbage unless constrained, so answers are checked against the
OpenAI chat route's on the same server (the same prompt, greedy, must give the same
text and token counts), forced tools against their schemas (the grammar makes the input
validate), and conversations with tool calls against the template's own rendering.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL_NAME, LiveServer, make_engine, start_server
from tests.server.test_openai_tools import TEMPLATE, TIME_PARAMETERS, WEATHER_PARAMETERS, prompt_ids

API_KEY = "anthropic-test-key"
TOOLS = [
    {"name": "get_weather", "description": "Weather", "input_schema": WEATHER_PARAMETERS},
    {"name": "get_time", "input_schema": TIME_PARAMETERS},
]
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
    for t in TOOLS
]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
MAX_TOKENS = 8
# Enough tokens for any call the schemas allow.
TOOL_MAX_TOKENS = 120


@pytest.fixture(scope="module")
def live(model_dir: Path) -> Iterator[LiveServer]:
    engine = make_engine(model_dir, max_model_len=1024)
    server = start_server(
        model_dir,
        engine,
        api_key=API_KEY,
        chat_template=TEMPLATE,
        enable_auto_tool_choice=True,
        tool_call_parser="llama3_json",
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def claude(live: LiveServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=live.url, api_key=API_KEY, max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def gpt(live: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key=API_KEY, max_retries=0) as client:
        yield client


def create(client: anthropic.Anthropic, **kwargs: Any):
    kwargs.setdefault("messages", MESSAGES)
    kwargs.setdefault("max_tokens", MAX_TOKENS)
    return client.messages.create(model=MODEL_NAME, **sampling(kwargs))


def sampling(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields in the body: this SDK's methods no longer take them as
    arguments (the API still does)."""
    extra = {name: kwargs.pop(name) for name in ("temperature", "top_p", "top_k") if name in kwargs}
    return {**kwargs, "extra_body": extra} if extra else kwargs


def prompt_tokens(usage: Any) -> int:
    """The whole prompt, as Anthropic splits it: the tokens computed, and those written
    to and read from the cache."""
    return usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens


def raw_events(live: LiveServer, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A streamed answer's events as (event name, data), in order."""
    with live.client(headers={"x-api-key": API_KEY}) as http:
        response = http.post("/v1/messages", json={"model": MODEL_NAME, "stream": True, **body})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for event in response.text.replace("\r\n", "\n").strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in event.split("\n"))
        assert set(fields) == {"event", "data"}, event
        data = json.loads(fields["data"])
        assert data["type"] == fields["event"]
        events.append((fields["event"], data))
    return events


def check_tool_uses(message) -> list[tuple[str, dict]]:
    """The message's tool_use blocks, each input valid against its tool's schema."""
    uses = [block for block in message.content if block.type == "tool_use"]
    assert uses and message.stop_reason == "tool_use"
    for use in uses:
        assert use.id.startswith("toolu_") and isinstance(use.input, dict)
        jsonschema.validate(use.input, SCHEMAS[use.name])
    assert len({use.id for use in uses}) == len(uses)
    return [(use.name, use.input) for use in uses]


# ---- plain answers ----


def test_message_is_the_chat_answer(claude, gpt):
    out = create(claude, system="Be brief.", temperature=0)
    ref = gpt.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "system", "content": "Be brief."}, *MESSAGES],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert out.id.startswith("msg_") and out.type == "message" and out.role == "assistant"
    assert out.model == MODEL_NAME
    text = ref.choices[0].message.content
    assert [(b.type, b.text) for b in out.content] == ([("text", text)] if text else [])
    expected = {"length": "max_tokens", "stop": "end_turn"}[ref.choices[0].finish_reason]
    assert out.stop_reason == expected and out.stop_sequence is None
    assert prompt_tokens(out.usage) == ref.usage.prompt_tokens
    assert out.usage.output_tokens == ref.usage.completion_tokens


def test_system_as_blocks_and_content_as_blocks(claude):
    plain = create(claude, system="Be brief.", temperature=0)
    blocks = create(
        claude,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}],
        temperature=0,
        metadata={"user_id": "u-1"},
    )
    assert blocks.content == plain.content and blocks.usage == plain.usage


def test_stop_sequence(claude):
    whole = create(claude, temperature=0, max_tokens=16)
    text = whole.content[0].text
    stop = text[3:5]
    out = create(claude, temperature=0, max_tokens=16, stop_sequences=[stop])
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == stop
    assert "".join(b.text for b in out.content) == text[: text.index(stop)]


def test_stream_helper_gives_the_whole_answer(claude):
    whole = create(claude, temperature=0)
    with claude.messages.stream(
        model=MODEL_NAME, max_tokens=MAX_TOKENS, messages=MESSAGES, extra_body={"temperature": 0}
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == whole.content[0].text
    assert [(b.type, b.text) for b in final.content] == [("text", whole.content[0].text)]
    assert prompt_tokens(final.usage) == prompt_tokens(whole.usage)
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.stop_reason == whole.stop_reason and final.id.startswith("msg_")


def test_raw_stream_event_order(live: LiveServer, claude):
    whole = create(claude, temperature=0)
    events = raw_events(live, {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0})
    names = [name for name, _ in events]
    deltas = names.count("content_block_delta")
    assert deltas > 1
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert (
        start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    )
    cached = start["usage"]["cache_read_input_tokens"]
    assert start["usage"]["input_tokens"] + cached == prompt_tokens(whole.usage)
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    text = ""
    for _, data in events[3 : 3 + deltas]:
        assert data["index"] == 0 and data["delta"]["type"] == "text_delta"
        text += data["delta"]["text"]
    assert text == whole.content[0].text
    assert events[-3][1] == {"type": "content_block_stop", "index": 0}
    assert events[-2][1]["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert events[-2][1]["usage"] == {"output_tokens": whole.usage.output_tokens}


# ---- tools ----


def test_forced_tool(claude):
    out = create(
        claude,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        max_tokens=TOOL_MAX_TOKENS,
        temperature=1.0,
    )
    [(name, _)] = check_tool_uses(out)
    assert name == "get_weather" and [b.type for b in out.content] == ["tool_use"]


def test_any_tool_without_parallel_calls(claude):
    for _ in range(3):
        out = create(
            claude,
            tools=TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            max_tokens=TOOL_MAX_TOKENS,
            temperature=1.0,
        )
        assert len(check_tool_uses(out)) == 1


def test_streamed_tool_use(live: LiveServer, claude):
    body = {"tools": TOOLS, "tool_choice": {"type": "any"}, "max_tokens": TOOL_MAX_TOKENS}
    with claude.messages.stream(model=MODEL_NAME, messages=MESSAGES, **body) as stream:
        final = stream.get_final_message()
    check_tool_uses(final)
    events = raw_events(live, {"messages": MESSAGES, **body})
    assert [n for n, _ in events[:3]] == ["message_start", "content_block_start", "ping"]
    assert [n for n, _ in events[-2:]] == ["message_delta", "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    uses: dict[int, dict[str, Any]] = {}
    for name, data in events[1:-2]:
        if name == "ping":
            continue
        if name == "content_block_start":
            block = data["content_block"]
            assert block["type"] == "tool_use" and block["input"] == {}
            assert data["index"] == len(uses) and block["id"].startswith("toolu_")
            uses[data["index"]] = {"name": block["name"], "json": ""}
        elif name == "content_block_delta":
            assert data["delta"]["type"] == "input_json_delta"
            uses[data["index"]]["json"] += data["delta"]["partial_json"]
        else:
            assert name == "content_block_stop" and data["index"] == len(uses) - 1
    assert uses and events[-3][0] == "content_block_stop"
    assert [n for n, _ in events].count("ping") == 1  # after the first block's start alone
    for use in uses.values():
        jsonschema.validate(json.loads(use["json"]), SCHEMAS[use["name"]])


TOOL_TURNS = [
    *MESSAGES,
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris", "days": 2},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 25 C"},
            {"type": "text", "text": "And tomorrow?"},
        ],
    },
]
# The same conversation as OpenAI chat messages.
OPENAI_TURNS = [
    *MESSAGES,
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 25 C", "name": "get_weather"},
    {"role": "user", "content": "And tomorrow?"},
]


def test_tool_result_turn(live: LiveServer, claude, gpt):
    out = create(
        claude, messages=TOOL_TURNS, tools=TOOLS, tool_choice={"type": "none"}, temperature=0
    )
    expected = prompt_ids(live, OPENAI_TURNS, tools=OPENAI_TOOLS)
    assert prompt_tokens(out.usage) == len(expected)
    ref = gpt.chat.completions.create(
        model=MODEL_NAME,
        messages=OPENAI_TURNS,
        tools=OPENAI_TOOLS,
        tool_choice="none",
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert prompt_tokens(out.usage) == ref.usage.prompt_tokens
    assert "".join(b.text for b in out.content) == ref.choices[0].message.content
    # A forced call after the results: its input follows the schema too.
    forced = create(
        claude,
        messages=TOOL_TURNS,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_time"},
        max_tokens=TOOL_MAX_TOKENS,
    )
    assert [name for name, _ in check_tool_uses(forced)] == ["get_time"]


def test_count_tokens(live: LiveServer, claude):
    counted = claude.messages.count_tokens(model=MODEL_NAME, messages=TOOL_TURNS, tools=TOOLS)
    assert counted.input_tokens == len(prompt_ids(live, OPENAI_TURNS, tools=OPENAI_TOOLS))
    out = create(claude, messages=TOOL_TURNS, tools=TOOLS, tool_choice={"type": "none"})
    assert prompt_tokens(out.usage) == counted.input_tokens
    plain = claude.messages.count_tokens(model=MODEL_NAME, messages=MESSAGES, system="Be brief.")
    expected = prompt_ids(live, [{"role": "system", "content": "Be brief."}, *MESSAGES])
    assert plain.input_tokens == len(expected)


# ---- keys and headers ----


def test_any_key_without_a_configured_one(server: LiveServer):
    """The conftest's default server has no key: the SDK's key is not checked."""
    with anthropic.Anthropic(base_url=server.url, api_key="anything", max_retries=0) as client:
        out = client.messages.create(
            model=MODEL_NAME, max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
        )
    assert out.usage.output_tokens == 2 and out.stop_reason == "max_tokens"


def test_the_key_as_x_api_key_or_bearer(live: LiveServer):
    body = {"model": MODEL_NAME, "max_tokens": 2, "messages": MESSAGES}
    with live.client() as http:
        for headers in (
            {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"},
            {"Authorization": f"Bearer {API_KEY}", "anthropic-beta": "some-feature-2025-01-01"},
        ):
            assert http.post("/v1/messages", json=body, headers=headers).status_code == 200
        chat = {"model": MODEL_NAME, "max_tokens": 2, "messages": MESSAGES}
        ok = http.post("/v1/chat/completions", json=chat, headers={"x-api-key": API_KEY})
        assert ok.status_code == 200
        for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
            refused = http.post("/v1/messages", json=body, headers=headers)
            assert refused.status_code == 401
            assert refused.json() == {
                "type": "error",
                "error": {"type": "authentication_error", "message": "invalid or missing API key"},
            }
            # The OpenAI routes keep OpenAI's shape.
            other = http.post("/v1/chat/completions", json=chat, headers=headers)
            assert other.status_code == 401 and other.json()["error"]["code"] == "invalid_api_key"
    wrong = anthropic.Anthropic(base_url=live.url, api_key="wrong", max_retries=0)
    with wrong as client, pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model=MODEL_NAME, max_tokens=2, messages=MESSAGES)


# ---- reasoning ----


@pytest.fixture(scope="module")
def thinking_server(model_dir: Path) -> Iterator[LiveServer]:
    server = start_server(model_dir, reasoning_parser="deepseek_r1")
    yield server
    server.stop()


def test_reasoning_is_a_thinking_block(thinking_server: LiveServer):
    """deepseek_r1 starts in the thinking; a random model never closes it, so its whole
    answer is a thinking block holding the chat route's reasoning_content."""
    url = thinking_server.url
    with anthropic.Anthropic(base_url=url, api_key="x", max_retries=0) as client:
        out = create(client, temperature=0)
        with client.messages.stream(
            model=MODEL_NAME,
            max_tokens=MAX_TOKENS,
            messages=MESSAGES,
            extra_body={"temperature": 0},
        ) as stream:
            events = [event.type for event in stream]
            final = stream.get_final_message()
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
        ref = client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0
        )
    reasoning = ref.choices[0].message.reasoning_content
    assert reasoning and [(b.type, b.thinking) for b in out.content] == [("thinking", reasoning)]
    assert [(b.type, b.thinking) for b in final.content] == [("thinking", reasoning)]
    assert "thinking" in events  # the helper's own event for each thinking_delta


# A template that opens the thinking in the prompt, as DeepSeek-R1's does.
THINK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: <think>\n{% endif %}"
)


def test_extended_thinking_is_the_chat_routes_budget(model_dir: Path, live):
    """thinking enabled: the template's enable_thinking and vLLM's thinking_token_budget,
    so its end is forced after budget_tokens (the thinking the prompt opened, which a
    random model never closes, ends there and text follows); disabled: enable_thinking
    false. Each answer is the chat route's with those fields."""
    server = start_server(model_dir, reasoning_parser="deepseek_r1", chat_template=THINK_TEMPLATE)
    try:
        check_thinking(server, live)
    finally:
        server.stop()


def check_thinking(thinking_server: LiveServer, live: LiveServer) -> None:
    url = thinking_server.url
    enabled = {"type": "enabled", "budget_tokens": 3}
    cases = [
        (enabled, {"thinking_token_budget": 3, "chat_template_kwargs": {"enable_thinking": True}}),
        ({"type": "disabled"}, {"chat_template_kwargs": {"enable_thinking": False}}),
    ]
    answers = []
    for thinking, fields in cases:
        with anthropic.Anthropic(base_url=url, api_key="x", max_retries=0) as client:
            out = create(client, max_tokens=20, temperature=0, thinking=thinking)
        with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
            ref = (
                client.chat.completions.create(
                    model=MODEL_NAME,
                    messages=MESSAGES,
                    max_tokens=20,
                    temperature=0,
                    extra_body=fields,
                )
                .choices[0]
                .message
            )
        blocks = [(b.type, b.thinking if b.type == "thinking" else b.text) for b in out.content]
        expected = [("thinking", ref.reasoning_content), ("text", ref.content)]
        assert blocks == [(kind, text) for kind, text in expected if text], thinking
        answers.append([kind for kind, _ in blocks])
    assert answers[0] == ["thinking", "text"]  # the budget ended the thinking
    # The budget must be under max_tokens (as Anthropic); without a reasoning parser the
    # server cannot tell the thinking apart: both a 400 naming the field.
    body = {"model": MODEL_NAME, "max_tokens": MAX_TOKENS, "messages": MESSAGES}
    over = {"type": "enabled", "budget_tokens": MAX_TOKENS}
    with thinking_server.client() as http:
        too_big = http.post("/v1/messages", json={**body, "thinking": over})
    with live.client(headers={"x-api-key": API_KEY}) as http:
        unparsed = http.post("/v1/messages", json={**body, "thinking": enabled})
    for response in (too_big, unparsed):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"].startswith("thinking"), response.text


def test_a_repeated_prompt_is_read_from_the_cache(claude):
    """The prompt's tokens the prefix cache held are cache_read_input_tokens, the rest
    input_tokens (a prompt asked again finds all its full blocks but the last token's)."""
    system = "You answer questions about the weather, briefly and with care. " * 4
    first = create(claude, system=system, temperature=0).usage
    again = create(claude, system=system, temperature=0).usage
    whole = prompt_tokens(first)
    assert prompt_tokens(again) == whole and first.cache_creation_input_tokens == 0
    assert again.cache_read_input_tokens == (whole - 1) // 16 * 16 > 0
    assert again.input_tokens == whole - again.cache_read_input_tokens
