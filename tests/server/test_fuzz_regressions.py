"""Requests the fuzzer (test_fuzz_openapi.py) found mishandled, each answered right now."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.server.conftest import LiveServer
from tests.server.openai_shapes import check_error_body


@pytest.fixture(scope="module")
def http(server: LiveServer):
    with server.client() as client:
        yield client


def refused(http: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    return check_error_body(response.json())


def test_tokenize_empty_messages(http: httpx.Client):
    """transformers refuses an empty conversation with a ValueError, which /tokenize
    let through as a 500 (chat completions mapped it to a 400 already)."""
    error = refused(http, "/tokenize", {"messages": []})
    assert error["param"] == "messages"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"input": [[False], [False, False]]}),
        ("/v1/embeddings", {"input": [True, 5]}),
        ("/v1/completions", {"prompt": [[True, 5]], "max_tokens": 2}),
        ("/v1/completions", {"prompt": "Hi", "stop_token_ids": [True]}),
        ("/detokenize", {"tokens": [False, 1]}),
    ],
)
def test_token_ids_are_never_booleans(http: httpx.Client, path: str, body: dict[str, Any]):
    """Pydantic took false and true for token ids 0 and 1 (and embedded them), though
    the engine counts no bool as a token id."""
    refused(http, path, body)


def test_logprobs_stay_json_when_the_logits_overflow(http: httpx.Client):
    """A repetition penalty of 5e-324 divides logits into infinities, their softmax into
    NaN; the logprobs then made JSONResponse fail, a 500. JSON has no NaN: they show as
    the lowest logprob, as -inf does."""
    body = {
        "prompt": "#\uc66b\u008a",
        "max_tokens": 8,
        "logprobs": 0,
        "repetition_penalty": 5e-324,
    }
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    logprobs = response.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert logprobs and all(isinstance(value, float) for value in logprobs)


# Found by the abuse battery (test_abuse_routes.py, test_abuse_constraints.py).


def test_responses_input_with_a_lone_surrogate(http: httpx.Client):
    """A string ``input`` was checked for valid Unicode outside validation, so its
    ValueError escaped as a 500."""
    body = b'{"input": "a\\ud800b", "store": false}'  # the escape: no encoder writes it raw
    response = http.post(
        "/v1/responses", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert check_error_body(response.json())["param"] == "input"


@pytest.mark.parametrize("depth", [600, 100_000])
@pytest.mark.parametrize("field", ["guided_json", "structural_tag"])
def test_constraints_as_json_text_nest_no_deeper_than_a_body(
    http: httpx.Client, field: str, depth: int
):
    """A schema (or structural tag) given as JSON text escaped the body's depth limit:
    copying it recursed past Python's stack (600 levels), or json.loads gave up with a
    RecursionError (100,000), a 500 either way."""
    text = '{"items": ' * depth + "{}" + "}" * depth
    if field == "structural_tag":
        text = '{"structures": ' + text + "}"
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, field: text}
    error = refused(http, "/v1/chat/completions", body)
    assert error["param"] == field, error
