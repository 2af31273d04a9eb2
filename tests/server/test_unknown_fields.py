"""Every OpenAI route refuses a field that neither OpenAI nor vLLM defines, in OpenAI's
words and shape; a field they define that we do not implement is a 400 naming it
(null, or a value that changes nothing, is accepted); fields that change nothing here
(user, store, metadata...) are accepted. Chat messages refuse keys they do not know."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import MODEL_NAME
from tests.server.openai_shapes import check_error_body

MESSAGES = [{"role": "user", "content": "hi"}]
# Each route's path and a valid body.
ROUTES = {
    "chat": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 2}),
    "completions": ("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}),
    "embeddings": ("/v1/embeddings", {"model": MODEL_NAME, "input": "hi"}),
    "tokenize": ("/tokenize", {"model": MODEL_NAME, "prompt": "hi"}),
    "tokenize-messages": ("/tokenize", {"model": MODEL_NAME, "messages": MESSAGES}),
    "detokenize": ("/detokenize", {"model": MODEL_NAME, "tokens": [5, 6]}),
    "score": ("/v1/score", {"model": MODEL_NAME, "text_1": "a b", "text_2": "c"}),
    "rerank": ("/v1/rerank", {"model": MODEL_NAME, "query": "a b", "documents": ["c"]}),
}
# Per route: fields defined elsewhere but not implemented, each with values that would
# change something (a 400 naming it) and those that change nothing besides null (vLLM's
# defaults, or what SGLang's router fills into every body it forwards): of the type the
# default has, as 0 is not false.
_SAMPLING = [
    ("logits_processors", (["pkg.Processor"],), ()),
    ("kv_transfer_params", ({"do_remote_decode": True},), ()),
    ("vllm_xargs", ({"key": 1},), ()),
    ("top_p_min", (0.5, False), (0.0, 0)),
    ("no_stop_trim", (True, 0), (False,)),
    ("return_hidden_states", (True,), (False,)),
    ("separate_reasoning", (False, 1), (True,)),
    ("stream_reasoning", (False,), (True,)),
]
_SCORE = [
    ("mm_processor_kwargs", ({"max_pixels": 1024},), ()),
    ("activation", (True,), ()),
    ("use_activation", (True,), ()),
    ("softmax", (True,), ()),
]
UNSUPPORTED = {
    "chat": [*_SAMPLING, ("media_io_kwargs", ({"video": {}},), ()),
             ("documents", ([{"text": "d"}],), ()), ("functions", ([{"name": "f"}],), ()),
             ("function_call", ("auto",), ()), ("verbosity", ("high",), ()),
             ("modalities", (["text", "audio"], ["audio"]), (["text"],)),
             ("audio", ({"voice": "alloy", "format": "wav"},), ()),
             ("prediction", ({"type": "content", "content": "hi"},), ()),
             ("web_search_options", ({},), ()), ("chat_template", ("{{ messages }}",), ())],
    "completions": [*_SAMPLING, ("prompt_embeds", ("AAAA",), ())],
    "embeddings": [],
    "tokenize": [("chat_template", ("{{ messages }}",), ())],
    "tokenize-messages": [("chat_template", ("{{ messages }}",), ())],
    "detokenize": [],
    "score": _SCORE,
    "rerank": _SCORE,
}  # fmt: skip
# Fields that change nothing here, accepted on the routes that define them.
HARMLESS = {
    "chat": {"user": "u1", "store": False, "metadata": {"k": "v"}, "service_tier": "auto",
             "prompt_cache_key": "k", "guided_decoding_backend": "guidance"},
    "completions": {"user": "u1", "service_tier": "auto", "skip_special_tokens": True},
    "embeddings": {"user": "u1", "encoding_format": "float", "additional_data": {"k": [1]}},
    "tokenize": {"add_special_tokens": True},
    "tokenize-messages": {},
    "detokenize": {},
    "score": {},
    "rerank": {},
}  # fmt: skip


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with server.client() as client:
        yield client


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", ["no_such_field", "guided_choices", "Temperature"])
def test_unknown_field_is_refused_in_openai_words(http, route: str, name: str):
    path, body = ROUTES[route]
    response = http.post(path, json={**body, name: 1})
    assert response.status_code == 400, response.text
    check_error_body(response.json())
    error = response.json()["error"]
    assert error["message"] == f"Unrecognized request argument supplied: {name}"
    assert error["param"] == name and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("route", ROUTES)
def test_valid_body_and_harmless_fields_are_accepted(http, route: str):
    path, body = ROUTES[route]
    plain = http.post(path, json=body)
    assert plain.status_code == 200
    response = http.post(path, json={**body, **HARMLESS[route]})
    assert response.status_code == 200, response.text
    if route not in ("chat", "completions"):  # nothing drawn: the same answer
        drop = ("id", "created")
        assert {k: v for k, v in response.json().items() if k not in drop} == {
            k: v for k, v in plain.json().items() if k not in drop
        }


@pytest.mark.parametrize(
    ("route", "name", "refused", "harmless"),
    [(route, *case) for route, cases in UNSUPPORTED.items() for case in cases],
    ids=[f"{route}-{case[0]}" for route, cases in UNSUPPORTED.items() for case in cases],
)
def test_unsupported_field_is_named_unless_it_changes_nothing(http, route, name, refused, harmless):
    path, body = ROUTES[route]
    for value in refused:
        response = http.post(path, json={**body, name: value})
        assert response.status_code == 400, (value, response.text)
        error = response.json()["error"]
        assert error["param"] == name and f"'{name}'" in error["message"], error
    for ok in (None, *harmless):
        response = http.post(path, json={**body, name: ok})
        assert response.status_code == 200, (name, ok, response.text)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_message_keys_are_checked(http, path: str):
    base = {"model": MODEL_NAME, "max_tokens": 2} if "chat" in path else {"model": MODEL_NAME}
    bad = [{"role": "user", "content": "hi", "contnet": "typo"}]
    response = http.post(path, json={**base, "messages": bad})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages.0.contnet"
    # An answer sent back as a message: its null extras and its reasoning are taken.
    answer = {
        "role": "assistant",
        "content": "hello",
        "refusal": None,
        "audio": None,
        "function_call": None,
        "annotations": None,
        "reasoning_content": "thought",
    }
    messages = [*MESSAGES, answer, {"role": "user", "content": "more"}]
    assert http.post(path, json={**base, "messages": messages}).status_code == 200
    refusing = [*MESSAGES, {**answer, "refusal": "no"}]
    response = http.post(path, json={**base, "messages": refusing})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages.1.refusal"


def test_nested_option_keys_are_checked(http):
    path, body = ROUTES["completions"]
    response = http.post(path, json={**body, "stream": True, "stream_options": {"usage": True}})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stream_options.usage"
