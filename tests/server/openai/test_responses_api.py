"""/v1/responses through the official `openai` client (`client.responses.create`,
`.stream`, `.retrieve`) against live servers on the real engine (a tiny random Llama)
with the hermes-style chat template of the tool tests.

A random model writes garbage unless constrained, so: plain text is compared with the
greedy text of the same prompt (the messages through the template), and ends at
max_output_tokens (status "incomplete"); function calls (tool_choice "required" or
named) and text.format's json_schema are constrained by the grammar, so they end by
themselves ("completed") and validate against their schemas.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.engine.test_json_schema import SMALL
from tests.server.conftest import MODEL_NAME, LiveServer, make_engine, start_server
from tests.server.gauges import is_idle
from tests.server.openai_shapes import check_error_body
from tests.server.test_openai_tools import TEMPLATE, TIME_PARAMETERS, WEATHER_PARAMETERS

TOOLS = [
    {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS},
    {"type": "function", "name": "get_time", "parameters": TIME_PARAMETERS},
]
CHAT_TOOLS = [
    {"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}
    for t in TOOLS
]
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
QUESTION = "Weather in Paris?"
# Enough tokens for any call the schemas allow, and for SMALL's JSON.
CONSTRAINED_TOKENS = 120
TEXT_TOKENS = 8


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[LiveServer]:
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
def client(server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60
    ) as client:
        yield client


def create(client: openai.OpenAI, **kwargs: Any):
    kwargs.setdefault("input", QUESTION)
    kwargs.setdefault("max_output_tokens", TEXT_TOKENS)
    kwargs.setdefault("temperature", 0)
    return client.responses.create(model=MODEL_NAME, **kwargs)


def prompt_ids(server: LiveServer, messages: list[dict], **kwargs: Any) -> list[int]:
    return server.engine.tokenizer.apply_chat_template(messages, chat_template=TEMPLATE, **kwargs)


def greedy(client: openai.OpenAI, ids: list[int], max_tokens: int = TEXT_TOKENS) -> str:
    out = client.completions.create(
        model=MODEL_NAME, prompt=ids, max_tokens=max_tokens, temperature=0
    )
    return out.choices[0].text


def event_kinds(types: list[str]) -> list[str]:
    """The event types with each run of deltas as one entry."""
    kinds: list[str] = []
    for kind in types:
        if not (kind.endswith(".delta") and kinds and kinds[-1] == kind):
            kinds.append(kind)
    return kinds


def check_calls(output, at_most: int | None = None) -> list[tuple[str, dict]]:
    """The response's function calls, each with arguments valid for its function."""
    calls = []
    for item in output:
        assert item.type == "function_call", item
        assert item.id.startswith("fc_") and item.call_id.startswith("call_")
        assert item.status == "completed"
        arguments = json.loads(item.arguments)
        jsonschema.validate(arguments, SCHEMAS[item.name])
        calls.append((item.name, arguments))
    assert calls and (at_most is None or len(calls) <= at_most)
    return calls


# ---- text ----


def test_plain_text_is_the_greedy_text(client, server):
    ids = prompt_ids(server, [{"role": "user", "content": QUESTION}])
    out = create(client)
    assert out.id.startswith("resp_") and out.object == "response"
    assert out.model == MODEL_NAME and out.store is True and out.temperature == 0
    assert out.status == "incomplete" and out.error is None  # only a failed one has one
    assert out.incomplete_details.reason == "max_output_tokens"
    [message] = out.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.status == "incomplete"
    [part] = message.content
    assert part.type == "output_text" and part.text == greedy(client, ids)
    assert out.output_text == part.text
    assert out.usage.input_tokens == len(ids)
    assert out.usage.output_tokens == TEXT_TOKENS
    assert out.usage.total_tokens == len(ids) + TEXT_TOKENS


def test_streamed_text_events_in_order(client):
    whole = create(client)
    events = list(create(client, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert event_kinds([e.type for e in events]) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    created, in_progress = events[0].response, events[1].response
    assert created.status == in_progress.status == "in_progress" and created.output == []
    final = events[-1].response
    assert created.id == final.id and final.status == "incomplete"
    item_id = events[2].item.id
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert all(e.item_id == item_id and e.output_index == 0 for e in deltas)
    text = "".join(e.delta for e in deltas)
    assert text == whole.output_text == final.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text
    assert events[-2].item.content[0].text == text
    assert final.usage.output_tokens == TEXT_TOKENS


def test_stream_on_the_wire(server):
    """Each event is ``event: <type>`` and ``data: {...}`` of that type; no [DONE]."""
    body = {"model": MODEL_NAME, "input": "Hi", "max_output_tokens": 2, "stream": True}
    with server.client() as http:
        response = http.post("/v1/responses", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = response.text.replace("\r\n", "\n").strip().split("\n\n")
    for event in events:
        name, data = event.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data.removeprefix("data: "))["type"] == name.removeprefix("event: ")
    assert events[-1].startswith("event: response.incomplete")


def test_instructions_are_the_first_system_message(client, server):
    ids = prompt_ids(
        server, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    out = create(client, input="Hi", instructions="Be brief.", max_output_tokens=1)
    assert out.usage.input_tokens == len(ids) and out.instructions == "Be brief."


# ---- function calls ----


def test_required_function_call(client):
    out = create(client, tools=TOOLS, tool_choice="required", max_output_tokens=CONSTRAINED_TOKENS)
    assert out.status == "completed" and out.incomplete_details is None
    check_calls(out.output)
    assert out.tool_choice == "required"
    assert [tool.name for tool in out.tools] == ["get_weather", "get_time"]


def test_required_without_parallel_calls(client):
    out = create(
        client,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        max_output_tokens=CONSTRAINED_TOKENS,
    )
    check_calls(out.output, at_most=1)
    assert out.parallel_tool_calls is False


def test_named_function_call_streamed(client):
    kwargs = dict(
        model=MODEL_NAME,
        input=QUESTION,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=CONSTRAINED_TOKENS,
        temperature=0,
    )
    whole = client.responses.create(**kwargs)
    [(name, arguments)] = check_calls(whole.output)
    assert name == "get_time"
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert event_kinds([e.type for e in events]) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2].item
    assert added.type == "function_call" and added.name == "get_time" and added.arguments == ""
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1  # the arguments came in pieces
    done = events[-3]
    assert done.arguments == "".join(deltas) and json.loads(done.arguments) == arguments
    assert events[-2].item.call_id == added.call_id
    assert check_calls(final.output) == [(name, arguments)]


def test_conversation_with_a_call_and_its_output(client, server):
    arguments = {"city": "Paris", "days": 2}
    items = [
        {"role": "user", "content": QUESTION},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": json.dumps(arguments),
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"},
        {"role": "user", "content": [{"type": "input_text", "text": "And the time?"}]},
    ]
    messages = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        {"role": "user", "content": "And the time?"},
    ]
    ids = prompt_ids(server, messages, tools=CHAT_TOOLS)
    assert "tool call_1: 18 C, sunny" in server.engine.tokenizer.decode(ids)
    out = create(
        client,
        input=items,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=CONSTRAINED_TOKENS,
    )
    assert out.usage.input_tokens == len(ids)
    [(name, _)] = check_calls(out.output)
    assert name == "get_time"


# ---- text.format ----


def test_json_schema_format(client):
    fmt = {"type": "json_schema", "name": "small", "schema": SMALL, "strict": True}
    kwargs = dict(text={"format": fmt}, max_output_tokens=CONSTRAINED_TOKENS)
    out = create(client, **kwargs)
    assert out.status == "completed"
    jsonschema.validate(json.loads(out.output_text), SMALL)
    assert out.text.format.type == "json_schema"
    events = list(create(client, stream=True, **kwargs))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == out.output_text


def test_json_object_format(client):
    out = create(client, text={"format": {"type": "json_object"}}, max_output_tokens=30)
    assert out.output_text.startswith("{")


# ---- stored responses ----


def test_previous_response_continues_the_conversation(client, server):
    first = create(client, input="Hi", instructions="Be brief.")
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    second = create(client, input="More?", previous_response_id=first.id)
    # The instructions of the first response are not carried over (as OpenAI).
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "More?"},
    ]
    assert second.usage.input_tokens == len(prompt_ids(server, messages))
    assert second.previous_response_id == first.id
    # A chain of three: the second response's conversation holds the first's.
    third = create(client, input="And?", previous_response_id=second.id, max_output_tokens=1)
    messages += [
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "And?"},
    ]
    assert third.usage.input_tokens == len(prompt_ids(server, messages))


def test_a_call_cut_off_is_left_out_of_the_continued_conversation(client, server):
    named = {"type": "function", "name": "get_weather"}
    cut = create(client, tools=TOOLS, tool_choice=named, max_output_tokens=4)
    [call] = cut.output
    assert cut.status == "incomplete" and call.type == "function_call"
    assert call.status == "incomplete"
    out = create(client, input="Hi", previous_response_id=cut.id, max_output_tokens=1)
    messages = [{"role": "user", "content": QUESTION}, {"role": "user", "content": "Hi"}]
    assert out.usage.input_tokens == len(prompt_ids(server, messages))


def test_streamed_response_is_stored(client):
    events = list(create(client, stream=True, metadata={"k": "v"}))
    final = events[-1].response
    stored = client.responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.metadata == {"k": "v"}


def test_store_false_and_delete(client):
    unstored = create(client, store=False, max_output_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as info:
        create(client, previous_response_id=unstored.id)
    assert info.value.body["param"] == "previous_response_id"
    stored = create(client, max_output_tokens=1)
    deleted = client.responses.with_raw_response.delete(stored.id).http_response.json()
    assert deleted == {"id": stored.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(stored.id)


# ---- refused ----

CALL_ITEM = {"type": "function_call", "call_id": "c", "name": "get_time", "arguments": "{}"}
REFUSED = [
    ({"foo": 1}, "foo", "foo"),
    ({"input": 5}, "input", None),
    ({"input": []}, "input", None),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input.0.type", None),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input.0.content.0",
        "takes no image input",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
        "input.0.content",
        "no files API",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "input.0.content",
        "input_file",
    ),
    (  # a part's type as an object (the fuzzer's): a 400, not a 500
        {"input": [{"role": "user", "content": [{"type": {"a": 1}, "text": "x"}]}]},
        "input.0.content",
        "{'a': 1}",
    ),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role", None),
    ({"input": [{**CALL_ITEM, "arguments": "[1]"}]}, "input.0.arguments", None),
    ({"input": [{"role": "user", "content": "x", "extra": 1}]}, "input.0.extra", None),
    ({"tools": [{"type": "web_search"}]}, "tools.0", "only function tools"),
    ({"tools": [{**TOOLS[0], "parameters": {"type": "string"}}]}, "tools.0.parameters", None),
    ({"tools": [{**TOOLS[0], "strict": True}]}, "tools.0.strict", None),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", None),
    ({"tool_choice": "sometimes"}, "tool_choice", None),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    (
        {"tools": TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}},
        "text.format",
        "text.format",
    ),
    ({"text": {"format": {"type": "yaml"}}}, "text.format", None),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", None),
    (
        {"text": {"format": {"type": "json_schema", "schema": {"type": "bogus"}}}},
        "text.format",
        None,
    ),
    ({"temperature": 3}, "temperature", None),
    ({"top_p": 0}, "top_p", None),
    ({"max_output_tokens": 0}, "max_output_tokens", None),
    ({"max_output_tokens": 5000}, "max_output_tokens", "maximum context length"),
    ({"input": "a " * 1100, "max_output_tokens": None}, "input", "maximum context length"),
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", None),
    ({"reasoning": {"effort": "max"}}, "reasoning.effort", None),
    ({"include": ["message.output_text.logprobs"]}, "include", "not supported"),
    ({"background": True}, "background", "not supported"),
    ({"previous_response_id": "resp_nope"}, "previous_response_id", "not found"),
]


@pytest.mark.parametrize(("fields", "param", "message"), REFUSED, ids=lambda v: str(v)[:40])
def test_refused(server, fields, param, message):
    body = {"model": MODEL_NAME, "input": "Hi", "max_output_tokens": 1, **fields}
    with server.client() as http:
        for stream in (False, True):
            response = http.post("/v1/responses", json={**body, "stream": stream})
            assert response.status_code == 400, response.text
            error = check_error_body(response.json())
            assert error["param"] == param, error
            assert message is None or message in error["message"], error


def test_neutral_values_of_unsupported_fields_are_taken(client):
    for include in ([], ["reasoning.encrypted_content"]):  # (no encrypted copy to give)
        out = create(
            client,
            max_output_tokens=1,
            extra_body={"background": False, "truncation": "disabled", "include": include},
        )
        assert out.status == "incomplete"


def test_hints_that_change_nothing_are_taken_and_echoed(server):
    """OpenAI's end-user id and prompt cache key, as the chat route takes them."""
    hints = {"safety_identifier": "user-7", "prompt_cache_key": "thread-1", "user": "u"}
    body = {"model": MODEL_NAME, "input": "Hi", "max_output_tokens": 1, **hints}
    with server.client() as http:
        out = http.post("/v1/responses", json=body)
    assert out.status_code == 200, out.text
    assert {key: out.json()[key] for key in hints} == hints


def test_unknown_model_and_unknown_id(server):
    with server.client() as http:
        response = http.post("/v1/responses", json={"model": "nope", "input": "Hi"})
        assert response.status_code == 404
        assert check_error_body(response.json())["param"] == "model"
        response = http.get("/v1/responses/resp_nope")
        assert response.status_code == 404 and check_error_body(response.json())


def test_refusals_leave_the_engine_idle(server, client):
    with server.client() as http:
        for fields, _, _ in REFUSED:
            http.post("/v1/responses", json={"model": MODEL_NAME, "input": "Hi", **fields})
        assert is_idle(http)
    assert create(client, max_output_tokens=1).status == "incomplete"


# ---- reasoning ----


@pytest.fixture(scope="module")
def reasoning_server(model_dir: Path) -> Iterator[LiveServer]:
    live = start_server(model_dir, chat_template=TEMPLATE, reasoning_parser="deepseek_r1")
    yield live
    live.stop()


def test_reasoning_items(reasoning_server):
    """DeepSeek-R1's output starts inside the thinking: unclosed, it is all reasoning."""
    with openai.OpenAI(
        base_url=f"{reasoning_server.url}/v1", api_key="x", max_retries=0, timeout=60
    ) as client:
        ids = prompt_ids(reasoning_server, [{"role": "user", "content": QUESTION}])
        expected = greedy(client, ids)
        assert expected and "</think>" not in expected
        out = create(client)
        [item] = out.output
        assert item.type == "reasoning" and item.id.startswith("rs_")
        assert item.content[0].type == "reasoning_text" and item.content[0].text == expected
        assert out.output_text == ""
        # Every output token is thinking: the usage says so.
        assert out.usage.output_tokens_details.reasoning_tokens == out.usage.output_tokens > 0
        events = list(create(client, stream=True))
    assert event_kinds([e.type for e in events]) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == expected
    usage = events[-1].response.usage
    assert usage.output_tokens_details.reasoning_tokens == usage.output_tokens == TEXT_TOKENS


def test_http_client_sees_the_same_body(server):
    """A plain HTTP client gets the documented fields (the SDK fills in what is missing)."""
    body = {"model": MODEL_NAME, "input": "Hi", "max_output_tokens": 1}
    out = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60).json()
    assert {
        "id", "object", "created_at", "status", "error", "incomplete_details", "instructions",
        "max_output_tokens", "model", "output", "parallel_tool_calls", "previous_response_id",
        "store", "temperature", "text", "tool_choice", "tools", "top_p", "usage", "metadata",
    } <= set(out)  # fmt: skip
    # (its values: tests/server/test_prompt_tokens_details.py)
    assert set(out["usage"]["input_tokens_details"]) == {"cached_tokens"}
