"""server/openai/embedding_request.py: the body's own bounds (what needs the model, the
input processor checks: test_openai_embeddings.py)."""

from __future__ import annotations

import pytest
from hetero_infer.server.openai.embedding_request import EmbeddingRequest
from hetero_infer.server.serving.request_body import MAX_EMBEDDING_INPUTS

from tests.server.body_bounds import check_body


@pytest.mark.parametrize(
    ("fields", "valid"),
    [
        ({"input": ["x"] * MAX_EMBEDDING_INPUTS}, True),
        ({"input": ["x"] * (MAX_EMBEDDING_INPUTS + 1)}, False),
        ({"input": [[1]] * (MAX_EMBEDDING_INPUTS + 1)}, False),
        ({"input": "x", "truncate_prompt_tokens": -1}, True),
        ({"input": "x", "truncate_prompt_tokens": -2}, False),
        ({"input": "x", "add_special_tokens": False}, True),
        ({"input": "x", "normalize": False, "priority": -3}, True),
        ({"input": "x", "request_id": "r" * 256}, True),
        ({"input": "x", "request_id": "r" * 257}, False),
        ({"input": "x", "request_id": ""}, False),
        ({"input": None, "messages": [{"role": "user", "content": "x"}]}, True),
        ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"a": 1}}, True),
        ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 5}, False),
    ],
)
def test_bounds(fields: dict, valid: bool):
    check_body(EmbeddingRequest, fields, valid)
