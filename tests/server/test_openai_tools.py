"""Tool calling and reasoning through the official `openai` client against live servers
on the real engine (a tiny random Llama) with a hermes-style chat template.

A random model writes garbage unless constrained, so what is tested how:
- tool_choice "required" and a named function are constrained by the grammar: the
  calls parse and their arguments validate against the functions' schemas;
- tool_choice "auto" runs the server's parser (llama3_json here) over what the model
  wrote: a response_format makes the model write a call in that format, and without
  one its plain answer comes back as content, equal to the greedy text. Each parser's
  reading of every shape is unit-tested in tests/server/serving/tool_parsers;
- a conversation with earlier calls and their results is rendered by the template
  (the prompt's token count says so) and answered;
- reasoning (deepseek_r1): the model's text, never closing its thinking, is
  reasoning_content; chat_template_kwargs reach the template.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from hetero_infer.server.serving.chat_messages import ChatMessage, template_messages

from tests.server.conftest import MODEL_NAME, LiveServer, make_engine, start_server

# A hermes-style template: the tools, earlier calls and tool results in the prompt.
TEMPLATE = (
    "<s>"
    "{%- if tools %}tools:{% for tool in tools %} {{ tool.function.name }}"
    "{{ tool.function.parameters | tojson }}{% endfor %}\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}assistant>"
    "{% for call in m.tool_calls %} <tool_call>"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "</tool_call>{% endfor %}\n"
    "{%- elif m.role == 'tool' %}tool {{ m.tool_call_id }}: {{ m.content }}\n"
    "{%- else %}{{ m.role }}> {{ m.content }}\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}assistant>"
    "{%- if enable_thinking is defined and not enable_thinking %} <think></think>{% endif %}"
    "{%- endif %}"
)
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME_PARAMETERS = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMETERS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
# Enough tokens for any call the schemas allow.
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def tools_server(model_dir: Path) -> Iterator[LiveServer]:
    # The tools in the prompt take a few hundred tokens (about one a character).
    engine = make_engine(model_dir, max_model_len=1024)
    live = start_server(
        model_dir,
        engine,
        chat_template=TEMPLATE,
        enable_auto_tool_choice=True,
        tool_call_parser="llama3_json",
    )
    yield live
    live.stop()


@pytest.fixture(scope="module")
def tools_client(tools_server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{tools_server.url}/v1", api_key="x", max_retries=0, timeout=60
    ) as client:
        yield client


def create(client: openai.OpenAI, **kwargs: Any):
    kwargs.setdefault("messages", MESSAGES)
    kwargs.setdefault("tools", TOOLS)
    kwargs.setdefault("max_tokens", MAX_TOKENS)
    return client.chat.completions.create(model=MODEL_NAME, **kwargs)


def check_calls(message, at_most: int | None = None) -> list[tuple[str, dict]]:
    """The message's calls, each with arguments that validate against its function."""
    assert message.content is None and message.tool_calls
    calls = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        calls.append((call.function.name, arguments))
    assert len({call.id for call in message.tool_calls}) == len(calls)
    assert at_most is None or len(calls) <= at_most
    return calls


def prompt_ids(server: LiveServer, messages: list[dict], **kwargs: Any) -> list[int]:
    """The prompt the server should build: the messages through the template."""
    rendered = template_messages([ChatMessage.model_validate(m) for m in messages])
    return server.engine.tokenizer.apply_chat_template(rendered, chat_template=TEMPLATE, **kwargs)


# ---- constrained: a named function, "required" ----


def test_named_function(tools_client):
    choice = {"type": "function", "function": {"name": "get_time"}}
    out = create(tools_client, tool_choice=choice, n=3, temperature=1.0, seed=7)
    for c in out.choices:
        assert c.finish_reason == "tool_calls"
        [(name, _)] = check_calls(c.message)
        assert name == "get_time"


def test_required(tools_client):
    out = create(tools_client, tool_choice="required", n=4, temperature=1.0, seed=3)
    names = set()
    for c in out.choices:
        assert c.finish_reason == "tool_calls"
        names.update(name for name, _ in check_calls(c.message))
    assert names <= set(SCHEMAS)


def test_required_without_parallel_calls(tools_client):
    out = create(
        tools_client,
        tool_choice="required",
        parallel_tool_calls=False,
        n=4,
        temperature=1.0,
        seed=5,
    )
    for c in out.choices:
        assert len(check_calls(c.message)) == 1


def test_streamed_calls_are_the_whole_calls_in_pieces(tools_client):
    kwargs = dict(tool_choice="required", temperature=1.0, seed=11)
    whole = create(tools_client, **kwargs).choices[0]
    expected = check_calls(whole.message)
    chunks = list(create(tools_client, stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    calls: dict[int, dict[str, Any]] = {}
    pieces = 0
    for chunk in chunks:
        delta = chunk.choices[0].delta
        assert not delta.content
        for entry in delta.tool_calls or []:
            if entry.index not in calls:  # a call's first entry: id, type, name
                assert entry.id and entry.type == "function" and entry.function.name
                calls[entry.index] = {"name": entry.function.name, "arguments": ""}
            else:
                assert entry.id is None and entry.function.name is None
            calls[entry.index]["arguments"] += entry.function.arguments or ""
            pieces += 1
    assert sorted(calls) == list(range(len(calls)))
    streamed = [(c["name"], json.loads(c["arguments"])) for c in calls.values()]
    assert streamed == expected
    assert pieces > len(calls)  # the arguments came in more than one piece
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


# ---- a conversation with earlier calls ----


def test_conversation_with_calls_and_results(tools_client, tools_server):
    arguments = {"city": "Paris", "days": 2}
    messages = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        {"role": "user", "content": "And the time?"},
    ]
    ids = prompt_ids(tools_server, messages, tools=TOOLS)
    text = tools_server.engine.tokenizer.decode(ids)
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}' in text
    assert "tool call_1: 18 C, sunny" in text and "get_time" in text
    choice = {"type": "function", "function": {"name": "get_time"}}
    out = create(tools_client, messages=messages, tool_choice=choice, temperature=0)
    assert out.usage.prompt_tokens == len(ids)
    [(name, _)] = check_calls(out.choices[0].message)
    assert name == "get_time"


def test_tokenize_uses_the_servers_template(tools_server):
    with tools_server.client() as http:
        out = http.post("/tokenize", json={"model": MODEL_NAME, "messages": MESSAGES}).json()
    assert out["tokens"] == prompt_ids(tools_server, MESSAGES)
    own = tools_server.engine.tokenizer.apply_chat_template(MESSAGES)  # the tokenizer's
    assert out["tokens"] != own


# ---- auto: the server's parser reads what the model wrote ----

# The call as llama3_json writes it, made the model's only way to answer.
LLAMA3_CALL = {
    "type": "json_schema",
    "json_schema": {
        "name": "call",
        "schema": {
            "type": "object",
            "properties": {"name": {"const": "get_time"}, "parameters": TIME_PARAMETERS},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        },
    },
}


def test_auto_reads_the_models_call(tools_client):
    out = create(tools_client, response_format=LLAMA3_CALL, temperature=1.0, seed=2)
    assert out.choices[0].finish_reason == "tool_calls"
    [(name, arguments)] = check_calls(out.choices[0].message)
    assert name == "get_time"
    stream = create(tools_client, response_format=LLAMA3_CALL, temperature=1.0, seed=2, stream=True)
    entries = [e for chunk in stream for e in chunk.choices[0].delta.tool_calls or []]
    assert entries[0].function.name == "get_time"
    assert json.loads("".join(e.function.arguments or "" for e in entries)) == arguments


def test_auto_without_a_call_is_a_plain_answer(tools_client, tools_server):
    ids = prompt_ids(tools_server, MESSAGES, tools=TOOLS)
    greedy = tools_client.completions.create(
        model=MODEL_NAME, prompt=ids, max_tokens=16, temperature=0
    ).choices[0]
    assert not greedy.text.lstrip().startswith("{")  # (what the parser would read as a call)
    for tool_choice in ("auto", "none"):
        out = create(tools_client, tool_choice=tool_choice, max_tokens=16, temperature=0)
        assert out.usage.prompt_tokens == len(ids)  # the tools are in the prompt either way
        message = out.choices[0].message
        assert message.content == greedy.text and not message.tool_calls
        assert out.choices[0].finish_reason == greedy.finish_reason


def test_flags_of_the_command_line(server_process_factory, tmp_path):
    """`hetero-infer serve` with vLLM's flags: the template file, auto tool choice and
    its parser reach the server."""
    template = tmp_path / "tools.jinja"
    template.write_text(TEMPLATE)
    process = server_process_factory(
        "--chat-template",
        str(template),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "llama3_json",
        "--max-model-len",
        "1024",
    )
    try:
        process.wait_ready()
        with openai.OpenAI(
            base_url=f"{process.url}/v1", api_key="x", max_retries=0, timeout=60
        ) as client:
            out = create(client, response_format=LLAMA3_CALL, temperature=0)
        [(name, _)] = check_calls(out.choices[0].message)
        assert name == "get_time"
    finally:
        process.kill()


# ---- refused ----


# Each field that constrains the output, which tool_choice "required" or a named function
# cannot be given with.
CONSTRAINTS = [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "any", "schema": {}}}},
    {"structured_outputs": {"regex": "[a-z]+"}},
    {"guided_choice": ["yes", "no"]},
]
CONSTRAINT_IDS = ["json_object", "json_schema", "structured_outputs", "guided_choice"]


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=CONSTRAINT_IDS)
def test_constraints_refused_with_constrained_tools(tools_server, choice, constraint):
    body = {"model": MODEL_NAME, "messages": MESSAGES, "tools": TOOLS, "tool_choice": choice}
    with tools_server.client() as http:
        response = http.post("/v1/chat/completions", json=body | constraint)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith(next(iter(constraint)))  # structured_outputs.regex
    assert "both constrain" in error["message"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{**TOOLS[1], "function": {**TOOLS[1]["function"], "strict": True}}]},
            "tools.0.function.strict",
        ),
        (
            {
                "tool_choice": "required",
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"x": {"type": "bogus"}},
                            },
                        },
                    }
                ],
            },
            "tools",
        ),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
    ],
    ids=["strict-with-auto", "unusable-schema", "kwargs-clash"],
)
def test_refused(tools_server, fields, param):
    body = {"model": MODEL_NAME, "messages": MESSAGES, "tools": TOOLS, **fields}
    with tools_server.client() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("choice", [None, "none", "auto"])
@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=CONSTRAINT_IDS)
def test_constraints_beside_unconstrained_tools(tools_server, choice, constraint):
    """Only "required" and a named function constrain the output; "auto" and "none"
    leave it to the body's constraint."""
    body = {"model": MODEL_NAME, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 4}
    body |= {"tool_choice": choice, **constraint}
    with tools_server.client() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


# ---- reasoning ----


@pytest.fixture(scope="module")
def reasoning_server(model_dir: Path) -> Iterator[LiveServer]:
    live = start_server(model_dir, chat_template=TEMPLATE, reasoning_parser="deepseek_r1")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def reasoning_client(reasoning_server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{reasoning_server.url}/v1", api_key="x", max_retries=0, timeout=60
    ) as client:
        yield client


def test_reasoning_content(reasoning_client, reasoning_server):
    ids = prompt_ids(reasoning_server, MESSAGES)
    greedy = (
        reasoning_client.completions.create(
            model=MODEL_NAME, prompt=ids, max_tokens=20, temperature=0
        )
        .choices[0]
        .text
    )
    assert greedy and "</think>" not in greedy
    # DeepSeek-R1's output starts inside the thinking: unclosed, it is all reasoning.
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=20, temperature=0)
    message = reasoning_client.chat.completions.create(**kwargs).choices[0].message
    assert message.reasoning_content == greedy and message.content is None
    chunks = list(reasoning_client.chat.completions.create(stream=True, **kwargs))
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    assert streamed == greedy
    assert not any(c.choices[0].delta.content for c in chunks)


def test_include_reasoning_false_leaves_it_out(reasoning_client):
    """vLLM's include_reasoning: the reasoning is parsed out and not sent; its tokens'
    logprobs still are (on the last chunk of a stream)."""
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=20, temperature=0)
    kwargs |= dict(extra_body={"include_reasoning": False}, logprobs=True)
    answer = reasoning_client.chat.completions.create(**kwargs)
    message = answer.choices[0].message
    assert message.reasoning_content is None and message.content is None
    assert len(answer.choices[0].logprobs.content) == answer.usage.completion_tokens == 20
    chunks = list(reasoning_client.chat.completions.create(stream=True, **kwargs))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(getattr(d, "reasoning_content", None) or d.content for d in deltas)
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs
                for entry in c.choices[0].logprobs.content]  # fmt: skip
    assert [e.token for e in streamed] == [e.token for e in answer.choices[0].logprobs.content]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_template_kwargs_reach_the_template(reasoning_client, reasoning_server):
    off = {"enable_thinking": False}
    ids = prompt_ids(reasoning_server, MESSAGES, template_kwargs=off)
    assert reasoning_server.engine.tokenizer.decode(ids).endswith("assistant> <think></think>")
    out = reasoning_client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=1,
        extra_body={"chat_template_kwargs": off},
    )
    assert out.usage.prompt_tokens == len(ids)
    assert len(ids) > len(prompt_ids(reasoning_server, MESSAGES))
