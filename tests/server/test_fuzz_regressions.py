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
