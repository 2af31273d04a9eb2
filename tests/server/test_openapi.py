"""The OpenAPI schema the app serves describes the OpenAI routes' request bodies (a
fuzzer builds its requests from it)."""

from __future__ import annotations

import pytest
from hetero_infer.engine.config import EngineConfig
from hetero_infer.server.app import build_app
from hetero_infer.server.settings import ServerSettings

BODIES = {
    "/v1/completions": "CompletionRequest",
    "/v1/chat/completions": "ChatCompletionRequest",
    "/v1/embeddings": "EmbeddingRequest",
    "/tokenize": "TokenizeRequest",
    "/detokenize": "DetokenizeRequest",
}


@pytest.fixture(scope="module")
def schema() -> dict:
    # The schema needs no engine: the app is built, never started.
    return build_app(ServerSettings(engine=EngineConfig())).openapi()


@pytest.mark.parametrize(("path", "body"), BODIES.items())
def test_post_routes_describe_their_bodies(schema: dict, path: str, body: str):
    request_body = schema["paths"][path]["post"]["requestBody"]
    assert request_body["required"] is True
    ref = request_body["content"]["application/json"]["schema"]["$ref"]
    assert ref == f"#/components/schemas/{body}"
    assert schema["components"]["schemas"][body]["properties"]


def test_body_fields_and_bounds(schema: dict):
    bodies = schema["components"]["schemas"]
    completion = bodies["CompletionRequest"]
    assert "prompt" in completion["required"]
    assert {"max_tokens", "temperature", "top_p", "n", "logprobs", "stream"} <= set(
        completion["properties"]
    )
    chat = bodies["ChatCompletionRequest"]
    assert "messages" in chat["required"]
    assert chat["properties"]["messages"]["items"] == {"$ref": "#/components/schemas/ChatMessage"}
    assert bodies["ChatMessage"]["properties"]["role"]["enum"]
    assert "/v1/models" in schema["paths"]
