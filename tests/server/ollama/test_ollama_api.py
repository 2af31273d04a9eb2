"""Ollama's API (/api/*) through the official `ollama` client against a live server on
the real engine (a tiny random Llama): chat and generate, whole and streamed (NDJSON
chunks, the final done object and its timings), tags, show, ps, version, embed and
the older embeddings, format json and a schema, and the 400s and 404s in Ollama's error shape.

A random model writes garbage, so texts are checked against the same server's OpenAI
routes under greedy decoding (the two APIs must agree token for token), and formats by
parsing and validating what came back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import ollama
import openai
import pytest

from tests.server.conftest import MAX_MODEL_LEN, MODEL_NAME, LiveServer

GREEDY = {"temperature": 0, "num_predict": 8}
MESSAGES = [{"role": "user", "content": "Hello there"}]
SCHEMA = {
    "type": "object",
    "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "available": {"type": "boolean"},
    },
    "required": ["age", "available"],
    "additionalProperties": False,
}
TIMINGS = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)


@pytest.fixture(scope="module")
def api(server: LiveServer) -> Iterator[ollama.Client]:
    with ollama.Client(host=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


@pytest.fixture(scope="module")
def oai(server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
        yield client


def check_done(body: dict[str, Any], prompt_tokens: int | None = None) -> None:
    assert body["done"] is True and body["done_reason"] in ("stop", "length")
    for name in TIMINGS:
        assert isinstance(body[name], int) and body[name] >= 0, name
    assert body["total_duration"] >= body["prompt_eval_duration"] + body["eval_duration"]
    assert body["prompt_eval_duration"] > 0 and body["eval_duration"] >= 0
    if prompt_tokens is not None:
        assert body["prompt_eval_count"] == prompt_tokens


def ndjson(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        return [json.loads(line) for line in response.iter_lines() if line]


def test_chat_agrees_with_openai_route(api: ollama.Client, oai: openai.OpenAI):
    answer = api.chat(model=MODEL_NAME, messages=MESSAGES, options=GREEDY, stream=False)
    expected = oai.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=8
    )
    assert answer.model == MODEL_NAME and answer.message.role == "assistant"
    assert answer.message.content == expected.choices[0].message.content
    assert answer.eval_count == expected.usage.completion_tokens
    check_done(answer.model_dump(), expected.usage.prompt_tokens)
    assert answer.done_reason == expected.choices[0].finish_reason


def test_streamed_chat_chunks_add_up(api: ollama.Client, http: httpx.Client):
    whole = api.chat(model=f"{MODEL_NAME}:latest", messages=MESSAGES, options=GREEDY)
    chunks = ndjson(
        http, "/api/chat", {"model": MODEL_NAME, "messages": MESSAGES, "options": GREEDY}
    )
    *pieces, final = chunks
    assert pieces and all(c["done"] is False for c in pieces)
    for chunk in chunks:
        assert chunk["model"] == MODEL_NAME and chunk["created_at"].endswith("Z")
        assert chunk["message"]["role"] == "assistant"
    assert "".join(c["message"]["content"] for c in pieces) == whole.message.content
    assert final["message"] == {"role": "assistant", "content": ""}
    assert "context" not in final  # /api/generate's alone, as Ollama's
    check_done(final, whole.prompt_eval_count)
    assert final["eval_count"] == whole.eval_count
    # The client reads the same stream.
    streamed = list(api.chat(model=MODEL_NAME, messages=MESSAGES, options=GREEDY, stream=True))
    assert "".join(c.message.content for c in streamed) == whole.message.content
    assert streamed[-1].done and not any(c.done for c in streamed[:-1])


def test_generate_raw_agrees_with_completions(api: ollama.Client, oai: openai.OpenAI):
    prompt = "The quick brown fox"
    answer = api.generate(model=MODEL_NAME, prompt=prompt, raw=True, options=GREEDY)
    expected = oai.completions.create(model=MODEL_NAME, prompt=prompt, temperature=0, max_tokens=8)
    assert answer.response == expected.choices[0].text
    assert answer.context is None  # raw: no context, as Ollama
    check_done(answer.model_dump(), expected.usage.prompt_tokens)


def test_generate_templated_streams_and_returns_context(api: ollama.Client, http: httpx.Client):
    body = {"model": MODEL_NAME, "prompt": "Hi", "system": "Be brief.", "options": GREEDY}
    whole = api.generate(**body, stream=False)
    assert whole.context and len(whole.context) == whole.prompt_eval_count + whole.eval_count
    *pieces, final = ndjson(http, "/api/generate", body)
    assert all(c["done"] is False and "message" not in c for c in pieces)
    assert "".join(c["response"] for c in pieces) == whole.response
    assert final["response"] == "" and final["context"] == list(whole.context)
    check_done(final, whole.prompt_eval_count)
    # The context carries the conversation on: it goes before the next prompt.
    follow = api.generate(model=MODEL_NAME, prompt="More", context=whole.context, options=GREEDY)
    assert follow.prompt_eval_count > len(whole.context)
    assert follow.context[: len(whole.context)] == whole.context
    # Its start was in the cache: prompt_eval_cached_count (Ollama's) counts the tokens
    # read from it, whole blocks of the context, within prompt_eval_count.
    again = {"model": MODEL_NAME, "prompt": "More", "context": whole.context, "stream": False}
    cached = http.post("/api/generate", json={**again, "options": GREEDY}).json()
    assert cached["prompt_eval_count"] == follow.prompt_eval_count
    assert cached["prompt_eval_cached_count"] == (cached["prompt_eval_count"] - 1) // 16 * 16
    assert cached["prompt_eval_cached_count"] > 0


def test_num_predict_larger_than_the_context_is_clamped(api: ollama.Client):
    options = {"temperature": 0, "num_predict": 10 * MAX_MODEL_LEN, "num_ctx": 100_000}
    answer = api.generate(model=MODEL_NAME, prompt="a " * 200, raw=True, options=options)
    assert answer.prompt_eval_count + answer.eval_count <= MAX_MODEL_LEN
    assert answer.done_reason in ("stop", "length")


def test_format_json_and_schema(api: ollama.Client):
    options = {"temperature": 0, "num_predict": 100}
    plain = api.chat(model=MODEL_NAME, messages=MESSAGES, format="json", options=options)
    if plain.done_reason == "stop":  # any object: a random model may write a long one
        assert isinstance(json.loads(plain.message.content), dict)
    answer = api.generate(model=MODEL_NAME, prompt="Age?", format=SCHEMA, options=options)
    assert answer.done_reason == "stop"
    jsonschema.validate(json.loads(answer.response), SCHEMA)
    streamed = list(
        api.chat(model=MODEL_NAME, messages=MESSAGES, format=SCHEMA, options=options, stream=True)
    )
    assert streamed[-1].done_reason == "stop"
    jsonschema.validate(json.loads("".join(c.message.content for c in streamed)), SCHEMA)


def test_logprobs(api: ollama.Client):
    answer = api.generate(
        model=MODEL_NAME, prompt="Hi", options=GREEDY, logprobs=True, top_logprobs=2
    )
    assert len(answer.logprobs) == answer.eval_count
    for entry in answer.logprobs:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    for top in ({}, {"top_logprobs": 0}):  # each token's own logprob, no alternatives
        bare = api.generate(model=MODEL_NAME, prompt="Hi", options=GREEDY, logprobs=True, **top)
        assert len(bare.logprobs) == bare.eval_count
        assert all(not entry.top_logprobs for entry in bare.logprobs)
    assert all(isinstance(entry.token, str) for entry in answer.logprobs)
    # Streamed, each token's entry rides on the chunk that sends its text.
    chunks = api.generate(
        model=MODEL_NAME, prompt="Hi", options=GREEDY, logprobs=True, top_logprobs=2, stream=True
    )
    streamed = [entry for chunk in chunks for entry in chunk.logprobs or []]
    assert [e.token for e in streamed] == [e.token for e in answer.logprobs]
    # (The prompt's KV now comes from the prefix cache: the same values to rounding.)
    assert [e.logprob for e in streamed] == pytest.approx(
        [e.logprob for e in answer.logprobs], abs=1e-3
    )
    assert all(len(e.top_logprobs) == 2 for e in streamed)


def test_load_requests_answer_at_once(http: httpx.Client):
    chat = http.post("/api/chat", json={"model": MODEL_NAME, "messages": []}).json()
    assert chat["done"] is True and chat["done_reason"] == "load"
    assert chat["message"] == {"role": "assistant", "content": ""}
    gen = http.post("/api/generate", json={"model": MODEL_NAME, "keep_alive": "5m"}).json()
    assert gen["done"] is True and gen["response"] == "" and gen["done_reason"] == "load"


def test_tags_show_ps_version(api: ollama.Client, server: LiveServer):
    [model] = api.list().models
    assert model.model == f"{MODEL_NAME}:latest"
    assert model.size > 0 and len(model.digest) == 64 and model.modified_at is not None
    details = model.details
    assert details.format == "safetensors" and details.family == "llama"
    assert details.parameter_size.endswith(("K", "M")) and details.quantization_level
    shown = api.show(MODEL_NAME)
    assert shown.details == details and shown.capabilities == ["completion"]  # text only
    assert shown.modelinfo["llama.context_length"] == MAX_MODEL_LEN
    assert shown.modelinfo["llama.embedding_length"] == server.engine.model_config.hidden_size
    assert shown.template == server.engine.tokenizer.hf_tokenizer.chat_template
    [running] = api.ps().models
    assert running.name == model.model and running.digest == model.digest
    assert running.context_length == MAX_MODEL_LEN and running.expires_at is not None
    version = httpx.get(f"{server.url}/api/version").json()["version"]
    assert [int(part) for part in version.split(".")] >= [0, 9, 0]


def test_template_round_trips_from_show(api: ollama.Client, http: httpx.Client):
    template = api.show(MODEL_NAME).template
    ok = http.post(
        "/api/generate",
        json={
            "model": MODEL_NAME,
            "prompt": "Hi",
            "template": template,
            "stream": False,
            "options": GREEDY,
        },
    )
    assert ok.status_code == 200 and ok.json()["done"] is True


def test_embed(api: ollama.Client, oai: openai.OpenAI, server: LiveServer):
    texts = ["Why is the sky blue?", "x"]
    out = api.embed(model=MODEL_NAME, input=texts)
    expected = oai.embeddings.create(model=MODEL_NAME, input=texts, encoding_format="float")
    assert len(out.embeddings) == 2
    for got, want in zip(out.embeddings, expected.data, strict=True):
        assert got == pytest.approx(want.embedding, abs=1e-5)
    assert out.prompt_eval_count == expected.usage.prompt_tokens
    one = api.embed(model=MODEL_NAME, input="Why is the sky blue?")
    assert one.embeddings[0] == pytest.approx(out.embeddings[0], abs=1e-5)
    # Longer than the context: cut to it by default, refused with truncate false.
    long = "word " * (2 * MAX_MODEL_LEN)
    assert api.embed(model=MODEL_NAME, input=long).prompt_eval_count == MAX_MODEL_LEN
    with pytest.raises(ollama.ResponseError) as refused:
        api.embed(model=MODEL_NAME, input=long, truncate=False)
    assert refused.value.status_code == 400 and "context length" in refused.value.error
    assert server.engine.block_manager.num_used_blocks == 0


def test_older_embeddings(api: ollama.Client, oai: openai.OpenAI, server: LiveServer):
    """/api/embeddings: one prompt's vector as the model gives it, not scaled to unit
    length (as Ollama's is not); an empty prompt only loads the model."""
    text = "Why is the sky blue?"
    out = api.embeddings(model=MODEL_NAME, prompt=text)
    raw = oai.embeddings.create(
        model=MODEL_NAME, input=text, encoding_format="float", extra_body={"normalize": False}
    )
    assert out.embedding == pytest.approx(raw.data[0].embedding, abs=1e-5)
    assert abs(sum(x * x for x in out.embedding) - 1) > 0.1
    assert api.embeddings(model=MODEL_NAME, prompt="").embedding == []
    with pytest.raises(ollama.ResponseError) as refused:
        api.embeddings(model=MODEL_NAME, prompt="word " * (2 * MAX_MODEL_LEN))
    assert refused.value.status_code == 400 and "context length" in refused.value.error
    assert server.engine.block_manager.num_used_blocks == 0


JSON_HEADERS = {"content-type": "application/json"}
BAD_BODIES = [
    ("/api/chat", {"messages": MESSAGES}, "model"),
    ("/api/chat", {"model": "", "messages": MESSAGES}, "model"),
    ("/api/generate", {"model": "", "prompt": "x"}, "model"),
    ("/api/embed", {"model": "", "input": "x"}, "model"),
    ("/api/chat", {"model": MODEL_NAME, "messages": [{"role": "robot", "content": "x"}]}, "role"),
    (
        "/api/chat",
        {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
        "images",
    ),
    (
        "/api/chat",
        {"model": MODEL_NAME, "messages": MESSAGES, "options": {"foo": 1, "bar": 2}},
        "'bar', 'foo'",
    ),
    (
        "/api/chat",
        {"model": MODEL_NAME, "messages": MESSAGES, "options": {"temperature": "hot"}},
        "options.temperature",
    ),
    (
        "/api/chat",
        {"model": MODEL_NAME, "messages": MESSAGES, "options": {"mirostat": 2}},
        "mirostat",
    ),
    (
        "/api/chat",
        {"model": MODEL_NAME, "messages": MESSAGES, "options": {"top_p": 0}},
        "options.top_p: ",  # the serving layer's check, named as the Ollama option
    ),
    (
        "/api/chat",
        {"model": MODEL_NAME, "messages": [{"role": "user", "content": "\ud800"}]},
        "messages.0.content: ",  # the serving layer's check of its chat messages
    ),
    ("/api/chat", {"model": MODEL_NAME, "messages": MESSAGES, "format": "yaml"}, "format"),
    ("/api/chat", {"model": MODEL_NAME, "messages": MESSAGES, "format": {"type": 5}}, "format"),
    ("/api/chat", {"model": MODEL_NAME, "messages": MESSAGES, "think": True}, "think"),
    ("/api/chat", {"model": MODEL_NAME, "messages": MESSAGES, "unknown_field": 1}, "unknown_field"),
    (
        "/api/chat",
        {
            "model": MODEL_NAME,
            "messages": MESSAGES,
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        "tools",
    ),
    (
        "/api/generate",
        {"model": MODEL_NAME, "prompt": "x", "template": "{{ .Prompt }}"},
        "template",
    ),
    ("/api/generate", {"model": MODEL_NAME, "prompt": "x", "suffix": "y"}, "suffix"),
    ("/api/generate", {"model": MODEL_NAME, "prompt": "x", "raw": True, "system": "s"}, "system"),
    (
        "/api/generate",
        {"model": MODEL_NAME, "prompt": "x", "options": {"num_predict": 0}},
        "num_predict",
    ),
    (
        "/api/generate",
        {"model": MODEL_NAME, "prompt": "x " * MAX_MODEL_LEN, "raw": True},
        "context length",
    ),
    ("/api/embed", {"model": MODEL_NAME, "input": "x", "dimensions": 3}, "dimensions"),
    ("/api/embed", {"model": MODEL_NAME, "input": ""}, "input"),
    ("/api/embed", {"model": MODEL_NAME}, "input"),
    ("/api/embed", {"model": MODEL_NAME, "input": ["x"] * 2049}, "at most 2048 inputs"),
    ("/api/embeddings", {"model": MODEL_NAME, "prompt": 5}, "prompt"),
    ("/api/embeddings", {"model": MODEL_NAME, "input": "x"}, "input"),
    ("/api/embeddings", {"prompt": "x"}, "model"),
    ("/api/show", {}, "model"),
]


@pytest.mark.parametrize(("path", "body", "named"), BAD_BODIES)
def test_bad_bodies_are_400s_in_ollama_shape(
    http: httpx.Client, server: LiveServer, path: str, body: dict, named: str
):
    # As JSON text with \u escapes: a lone surrogate in it is still valid JSON.
    response = http.post(path, content=json.dumps(body), headers=JSON_HEADERS)
    assert response.status_code == 400, response.text
    error = response.json()
    assert list(error) == ["error"] and isinstance(error["error"], str)
    assert named in error["error"]
    assert server.engine.block_manager.num_used_blocks == 0


def test_the_root_answers_ollamas_probe(http: httpx.Client):
    """The ollama command line takes a server that answers HEAD / with a 2xx as running."""
    probe = http.head("/")
    assert probe.status_code == 200 and probe.content == b""
    assert probe.headers["content-type"].startswith("text/html")
    assert http.get("/").status_code == 200


def test_not_json_is_a_400(http: httpx.Client):
    response = http.post("/api/chat", content=b"{not json", headers=JSON_HEADERS)
    assert response.status_code == 400 and "JSON" in response.json()["error"]


def test_unknown_model_is_a_404(api: ollama.Client, http: httpx.Client):
    for call in (
        lambda: api.chat(model="llama3:8b", messages=MESSAGES),
        lambda: api.generate(model=f"{MODEL_NAME}:7b", prompt="x"),
        lambda: api.embed(model="nope", input="x"),
        lambda: api.embeddings(model="nope", prompt="x"),
        lambda: api.show("nope"),
        lambda: api.chat(model="x", messages=MESSAGES),  # one letter is a name
    ):
        with pytest.raises(ollama.ResponseError) as refused:
            call()
        assert refused.value.status_code == 404 and "not found" in refused.value.error
    # A stream is refused before it starts: the status line says so.
    response = http.post("/api/chat", json={"model": "nope", "messages": MESSAGES})
    assert response.status_code == 404 and list(response.json()) == ["error"]
