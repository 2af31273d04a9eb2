"""vLLM's /v1/score and /rerank (/v1/rerank) in their documented shapes: each score is
the cosine similarity of the two texts' embeddings, as /v1/embeddings gives them (which
tests/server/test_openai_embeddings.py holds to transformers)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.conftest import MODEL_NAME, LiveServer

QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "Bananas are yellow.", "x y z", "France"]


def post(server: LiveServer, path: str, body: dict[str, Any], status: int = 200) -> Any:
    with server.client() as http:
        response = http.post(path, json={"model": MODEL_NAME, **body})
    assert response.status_code == status, response.text
    return response.json()


def cosine(server: LiveServer, a: str, b: str) -> float:
    data = post(server, "/v1/embeddings", {"input": [a, b]})["data"]
    return sum(x * y for x, y in zip(data[0]["embedding"], data[1]["embedding"], strict=True))


def test_score_one_against_many_and_pairwise(server: LiveServer):
    answer = post(server, "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS})
    assert answer["object"] == "list" and answer["model"] == MODEL_NAME
    assert answer["id"].startswith("score-") and isinstance(answer["created"], int)
    assert [d["index"] for d in answer["data"]] == list(range(len(DOCUMENTS)))
    for item, document in zip(answer["data"], DOCUMENTS, strict=True):
        assert item["object"] == "score"
        assert item["score"] == pytest.approx(cosine(server, QUERY, document), abs=1e-5)
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0
    pairwise = post(server, "/score", {"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[2:]})
    expected = [cosine(server, a, b) for a, b in zip(DOCUMENTS[:2], DOCUMENTS[2:], strict=True)]
    assert [d["score"] for d in pairwise["data"]] == pytest.approx(expected, abs=1e-5)
    bad = post(server, "/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, 400)
    assert bad["error"]["param"] == "text_2"


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_best_first(server: LiveServer, path: str):
    scores = [cosine(server, QUERY, document) for document in DOCUMENTS]
    best_first = sorted(range(len(DOCUMENTS)), key=lambda i: -scores[i])
    answer = post(server, path, {"query": QUERY, "documents": DOCUMENTS, "top_n": 3})
    assert answer["id"].startswith("rerank-") and answer["usage"]["total_tokens"] > 0
    results = answer["results"]
    assert [r["index"] for r in results] == best_first[:3]
    for result in results:
        assert result["relevance_score"] == pytest.approx(scores[result["index"]], abs=1e-5)
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
    cohere = [{"text": d} for d in DOCUMENTS]
    whole = post(server, path, {"query": QUERY, "documents": cohere, "return_documents": False})
    assert [r["index"] for r in whole["results"]] == best_first
    assert all("document" not in r for r in whole["results"])
