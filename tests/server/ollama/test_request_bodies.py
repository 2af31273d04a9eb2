"""server/ollama/request_bodies.py: the bounds a body holds before it reaches the
engine (what needs the model is checked when the request is built: test_ollama_api.py)."""

from __future__ import annotations

import pytest
from hetero_infer.server.ollama.request_bodies import EmbeddingsRequest, EmbedRequest
from hetero_infer.server.serving.request_body import MAX_EMBEDDING_INPUTS

from tests.server.body_bounds import check_body


@pytest.mark.parametrize(
    ("fields", "valid"),
    [
        ({"input": ["x"] * MAX_EMBEDDING_INPUTS}, True),
        ({"input": ["x"] * (MAX_EMBEDDING_INPUTS + 1)}, False),
        ({"input": "x" * 10_000}, True),  # one input: no count to hold
        ({"input": "x", "truncate": False, "dimensions": 4}, True),
    ],
)
def test_embed_bounds(fields: dict, valid: bool):
    check_body(EmbedRequest, {"model": "m", **fields}, valid)


@pytest.mark.parametrize(
    ("fields", "valid"),
    [
        ({}, True),  # no prompt: the model is only loaded
        ({"prompt": "x", "options": {"temperature": 0}, "keep_alive": "5m"}, True),
        ({"prompt": ["x"]}, False),  # one prompt, not a list
        ({"model": ""}, False),
    ],
)
def test_embeddings_bounds(fields: dict, valid: bool):
    check_body(EmbeddingsRequest, {"model": "m", **fields}, valid)
