"""SageMaker's /invocations: each body served by the route whose body it is, as vLLM
routes it, with that route's answers and errors."""

from __future__ import annotations

import pytest

from tests.server.conftest import MODEL_NAME, LiveServer

GREEDY = {"model": MODEL_NAME, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
BODIES = {
    "/v1/chat/completions": {**GREEDY, "messages": [{"role": "user", "content": "Hi"}]},
    "/v1/completions": {**GREEDY, "prompt": "Hello world and the"},
    "/v1/embeddings": {"model": MODEL_NAME, "input": ["Hello", "world"]},
    "/v1/rerank": {"model": MODEL_NAME, "query": "a b", "documents": ["c", "a b"]},
    "/v1/score": {"model": MODEL_NAME, "text_1": "a b", "text_2": ["c", "a b"]},
}
# What differs from one answer to the next.
FRESH = ("id", "created")


def without_fresh(answer: dict) -> dict:
    return {key: value for key, value in answer.items() if key not in FRESH}


@pytest.mark.parametrize("path", list(BODIES))
def test_each_body_gets_its_routes_answer(server: LiveServer, path: str):
    with server.client() as http:
        direct = http.post(path, json=BODIES[path])
        invoked = http.post("/invocations", json=BODIES[path])
    assert direct.status_code == invoked.status_code == 200, invoked.text
    assert without_fresh(invoked.json()) == without_fresh(direct.json())


def test_a_stream_streams(server: LiveServer):
    body = {**BODIES["/v1/completions"], "stream": True}
    with server.client() as http:
        response = http.post("/invocations", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL_NAME, "messages": "Hi"}, "messages"),  # the chat route's own 400
        ({"model": MODEL_NAME, "prompt": "a", "max_tokens": 0}, "max_tokens"),
        ({"model": MODEL_NAME}, None),  # no route's body
        (["messages"], None),
    ],
)
def test_bad_bodies_get_the_routes_400(server: LiveServer, body, param):
    with server.client() as http:
        response = http.post("/invocations", json=body)
        garbled = http.post("/invocations", content=b"{not json")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert garbled.status_code == 400 and "not valid JSON" in garbled.json()["error"]["message"]
