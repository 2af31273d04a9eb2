"""server/openai/scoring_request.py: the bounds of /v1/score's and /rerank's bodies, and
how score texts pair (the scores themselves are test_scoring.py's, on a live server)."""

from __future__ import annotations

import pytest
from hetero_infer.server.openai.scoring_request import (
    MAX_SCORED_TEXTS,
    RerankRequest,
    ScoreRequest,
)

from tests.server.body_bounds import check_body

MANY = ["x"] * MAX_SCORED_TEXTS


@pytest.mark.parametrize(
    ("fields", "valid"),
    [
        ({"text_1": "a", "text_2": "b"}, True),
        ({"text_1": "", "text_2": "b"}, False),
        ({"text_1": "a", "text_2": []}, False),
        ({"text_1": ["a"], "text_2": ["b"]}, True),
        ({"text_1": "a", "text_2": MANY}, True),
        ({"text_1": [*MANY, "x"], "text_2": "b"}, False),
        ({"text_1": "a", "text_2": "b", "truncate_prompt_tokens": -1}, True),
        ({"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 1}, True),
        ({"text_1": "a", "text_2": "b", "truncate_prompt_tokens": -2}, False),
    ],
)
def test_score_bounds(fields: dict, valid: bool):
    check_body(ScoreRequest, fields, valid)


@pytest.mark.parametrize(
    ("text_1", "text_2", "pairs"),
    [
        ("q", ["a", "b"], [("q", "a"), ("q", "b")]),
        (["a", "b"], "q", [("a", "q"), ("b", "q")]),
        (["a", "b"], ["c", "d"], [("a", "c"), ("b", "d")]),
        (["a"], ["c"], [("a", "c")]),
    ],
)
def test_score_pairs(text_1, text_2, pairs):
    assert ScoreRequest(text_1=text_1, text_2=text_2).pairs() == pairs


def test_lists_of_two_lengths_do_not_pair():
    with pytest.raises(ValueError, match="got 2 and 3"):
        ScoreRequest(text_1=["a", "b"], text_2=["c", "d", "e"]).pairs()


@pytest.mark.parametrize(
    ("fields", "valid"),
    [
        ({"query": "q", "documents": MANY}, True),
        ({"query": "q", "documents": [*MANY, "x"]}, False),
        ({"query": "", "documents": ["a"]}, False),
        ({"query": "q", "documents": []}, False),
        ({"query": "q", "documents": ["a"], "top_n": 0}, True),
        ({"query": "q", "documents": ["a"], "top_n": -1}, False),
        ({"query": "q", "documents": ["a"], "truncate_prompt_tokens": -1}, True),
        ({"query": "q", "documents": ["a"], "truncate_prompt_tokens": -2}, False),
    ],
)
def test_rerank_bounds(fields: dict, valid: bool):
    check_body(RerankRequest, fields, valid)


def test_rerank_documents_in_either_shape():
    request = RerankRequest(query="q", documents=["a", {"text": "b"}])
    assert request.texts() == ["a", "b"]
