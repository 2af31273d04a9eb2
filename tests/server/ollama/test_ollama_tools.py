"""/api/chat's tools and think through the official `ollama` client against a live
server on the real engine (a tiny random Llama) with a hermes-style chat template, the
llama3_json tool parser and the qwen3 reasoning parser.

A random model writes a call only when made to: a ``format`` schema of the parser's
call shape makes it write one, which comes back as Ollama's tool_calls (arguments an
object that validates). Earlier calls and tool results reach the template; ``think``
reaches it too (``enable_thinking``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import ollama
import pytest
from hetero_infer.server.ollama.chat import openai_messages
from hetero_infer.server.ollama.request_bodies import OllamaMessage

from tests.server.conftest import MODEL_NAME, LiveServer, make_engine, start_server
from tests.server.test_openai_tools import TEMPLATE, TOOLS, WEATHER_PARAMETERS

MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
# What llama3_json reads as a call of get_weather.
CALL_FORMAT = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "parameters": WEATHER_PARAMETERS},
    "required": ["name", "parameters"],
    "additionalProperties": False,
}
OPTIONS = {"temperature": 0, "num_predict": 120}


@pytest.fixture(scope="module")
def tools_server(model_dir: Path) -> Iterator[LiveServer]:
    live = start_server(
        model_dir,
        make_engine(model_dir, max_model_len=1024),
        chat_template=TEMPLATE,
        enable_auto_tool_choice=True,
        tool_call_parser="llama3_json",
        reasoning_parser="qwen3",
    )
    yield live
    live.stop()


@pytest.fixture(scope="module")
def api(tools_server: LiveServer) -> Iterator[ollama.Client]:
    with ollama.Client(host=tools_server.url, timeout=60) as client:
        yield client


def test_a_call_comes_back_as_ollama_tool_calls(api: ollama.Client):
    answer = api.chat(
        model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, format=CALL_FORMAT, options=OPTIONS
    )
    assert answer.done_reason == "stop" and answer.message.content == ""
    [call] = answer.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(dict(call.function.arguments), WEATHER_PARAMETERS)
    streamed = list(
        api.chat(
            model=MODEL_NAME,
            messages=MESSAGES,
            tools=TOOLS,
            format=CALL_FORMAT,
            options=OPTIONS,
            stream=True,
        )
    )
    with_calls = [chunk for chunk in streamed if chunk.message.tool_calls]
    assert len(with_calls) == 1 and not with_calls[0].done and streamed[-1].done
    assert with_calls[0].message.tool_calls == answer.message.tool_calls


def test_earlier_calls_and_results_reach_the_template(api: ollama.Client):
    plain = api.chat(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, options=OPTIONS)
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}}
            ],
        },
        {"role": "tool", "tool_name": "get_weather", "content": "sunny"},
    ]
    answer = api.chat(model=MODEL_NAME, messages=history, tools=TOOLS, options=OPTIONS)
    assert answer.done and answer.prompt_eval_count > plain.prompt_eval_count + 10


def test_think_reaches_the_template(api: ollama.Client, tools_server: LiveServer):
    options = {"temperature": 0, "num_predict": 4}
    unset = api.chat(model=MODEL_NAME, messages=MESSAGES, options=options)
    off = api.chat(model=MODEL_NAME, messages=MESSAGES, options=options, think=False)
    on = api.chat(model=MODEL_NAME, messages=MESSAGES, options=options, think=True)
    # The template writes an empty <think></think> when thinking is off.
    assert off.prompt_eval_count > unset.prompt_eval_count == on.prompt_eval_count
    # The random model opens no <think>: all of its text is the answer.
    assert on.message.thinking is None and on.message.content == unset.message.content
    # /api/generate's prompt goes through the same template.
    prompt = MESSAGES[-1]["content"]
    unset_generated = api.generate(model=MODEL_NAME, prompt=prompt, options=options)
    off_generated = api.generate(model=MODEL_NAME, prompt=prompt, options=options, think=False)
    assert off_generated.prompt_eval_count > unset_generated.prompt_eval_count
    levels = httpx.post(
        f"{tools_server.url}/api/chat",
        json={
            "model": MODEL_NAME,
            "messages": MESSAGES,
            "think": "high",
            "stream": False,
            "options": options,
        },
    )
    assert levels.status_code == 200 and levels.json()["done"] is True


@pytest.fixture(scope="module")
def r1_server(model_dir: Path) -> Iterator[LiveServer]:
    """DeepSeek-R1's parser: an answer starts inside its thinking, so the random model's
    text, which never closes it, is all thinking."""
    live = start_server(model_dir, reasoning_parser="deepseek_r1")
    yield live
    live.stop()


def test_thinking_is_split_off_unless_a_format_constrains(r1_server: LiveServer):
    options = {"temperature": 0, "num_predict": 6}
    with ollama.Client(host=r1_server.url, timeout=60) as api:
        unset = api.chat(model=MODEL_NAME, messages=MESSAGES, options=options)
        assert unset.message.thinking and not unset.message.content
        # JSON from the first token: nothing to split.
        shaped = api.chat(model=MODEL_NAME, messages=MESSAGES, options=options, format="json")
        assert shaped.message.content.startswith("{") and shaped.message.thinking is None


def test_tool_messages_answer_the_calls_they_name():
    messages = [
        OllamaMessage(role="user", content="?"),
        OllamaMessage.model_validate(
            {
                "role": "assistant",
                "tool_calls": [
                    {"function": {"name": "a", "arguments": {"x": 1}}},
                    {"id": "given", "function": {"name": "b"}},
                    {"function": {"name": "a", "arguments": {}}},
                ],
            }
        ),
        OllamaMessage(role="tool", tool_name="a", content="1"),
        OllamaMessage(role="tool", tool_call_id="given", content="2"),
        OllamaMessage(role="tool", tool_name="a", content="3"),
    ]
    converted = openai_messages(messages)
    calls = converted[1]["tool_calls"]
    assert [call["id"] for call in calls] == ["call_1_0", "given", "call_1_2"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": 1}
    assert [m["tool_call_id"] for m in converted[2:]] == ["call_1_0", "given", "call_1_2"]
    assert converted[2]["name"] == "a" and "name" not in converted[3]
    # A call's own id wins over its function's name, which two calls may share.
    calls = [
        {"id": "first", "function": {"name": "a"}},
        {"id": "second", "function": {"name": "a"}},
    ]
    answers = openai_messages([
        OllamaMessage(role="user", content="?"),
        OllamaMessage.model_validate({"role": "assistant", "tool_calls": calls}),
        OllamaMessage(role="tool", tool_name="a", tool_call_id="second", content="2"),
        OllamaMessage(role="tool", tool_name="a", tool_call_id="first", content="1"),
    ])  # fmt: skip
    assert [m["tool_call_id"] for m in answers[2:]] == ["second", "first"]
