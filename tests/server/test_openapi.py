"""The OpenAPI schema the app serves describes the routes' request bodies (OpenAI's,
Anthropic's and Ollama's), their answers and their errors (a fuzzer builds its requests
from it and checks the answers against it: test_fuzz_openapi.py)."""

from __future__ import annotations

import jsonschema
import pytest
from hetero_infer.engine.params.guided_decoding import grammar_text
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import ValidationError as ParamsError
from hetero_infer.server.app import build_app
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.completion_request import CompletionRequest
from hetero_infer.server.settings import ServerSettings
from pydantic import ValidationError

BODIES = {
    "/v1/completions": "CompletionRequest",
    "/v1/chat/completions": "ChatCompletionRequest",
    "/v1/embeddings": "EmbeddingRequest",
    "/tokenize": "TokenizeRequest",
    "/detokenize": "DetokenizeRequest",
    "/v1/responses": "ResponsesRequest",
    "/v1/messages": "MessagesRequest",
    "/v1/messages/count_tokens": "CountTokensRequest",
    "/api/chat": "ChatRequest",
    "/api/generate": "GenerateRequest",
    "/api/embed": "EmbedRequest",
    "/api/show": "ShowRequest",
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


ANSWERS = {
    ("/v1/completions", "post"): "CompletionResponse",
    ("/v1/chat/completions", "post"): "ChatCompletionResponse",
    ("/v1/embeddings", "post"): "EmbeddingResponse",
    ("/v1/models", "get"): "ModelList",
    ("/tokenize", "post"): "TokenizeResponse",
    ("/detokenize", "post"): "DetokenizeResponse",
    ("/v1/responses", "post"): "ResponseObject",
    ("/v1/responses/{response_id}", "get"): "ResponseObject",
    ("/v1/messages", "post"): "MessageResponse",
    ("/v1/messages/count_tokens", "post"): "CountTokensResponse",
    ("/api/chat", "post"): "ChatAnswer",
    ("/api/generate", "post"): "GenerateAnswer",
    ("/api/embed", "post"): "EmbedAnswer",
    ("/api/tags", "get"): "TagList",
    ("/api/ps", "get"): "RunningList",
    ("/api/show", "post"): "ShowAnswer",
    ("/api/version", "get"): "VersionAnswer",
}
STREAMING = {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"}
# Streamed as newline-delimited JSON, as Ollama's server does.
NDJSON = {"/api/chat", "/api/generate"}


def error_schema(path: str) -> str:
    """Each family's routes answer errors in its own shape."""
    if path.startswith("/api/"):
        return "OllamaError"
    if path.startswith("/v1/messages"):
        return "AnthropicErrorResponse"
    return "ErrorResponse"


def json_ref(response: dict) -> str:
    return response["content"]["application/json"]["schema"]["$ref"]


@pytest.mark.parametrize(("route", "answer"), ANSWERS.items(), ids=lambda v: str(v))
def test_routes_document_their_answers_and_errors(schema: dict, route: tuple, answer: str):
    path, method = route
    responses = schema["paths"][path][method]["responses"]
    assert json_ref(responses["200"]) == f"#/components/schemas/{answer}"
    assert ("text/event-stream" in responses["200"]["content"]) == (path in STREAMING)
    assert ("application/x-ndjson" in responses["200"]["content"]) == (path in NDJSON)
    for status in ("4XX", "503"):
        assert json_ref(responses[status]) == f"#/components/schemas/{error_schema(path)}"
    # errors.py answers FastAPI's validation errors with a 400, never a 422.
    assert "422" not in responses


def test_error_shape_is_openai_s(schema: dict):
    bodies = schema["components"]["schemas"]
    assert bodies["ErrorResponse"]["required"] == ["error"]
    assert bodies["ErrorResponse"]["additionalProperties"] is False
    info = bodies["ErrorInfo"]
    assert sorted(info["required"]) == ["code", "message", "param", "type"]
    assert info["additionalProperties"] is False


def test_loose_fields_have_useful_schemas(schema: dict):
    """Fields validated as dicts and checked by hand still say what they take."""
    bodies = schema["components"]["schemas"]
    response_format = bodies["CompletionRequest"]["properties"]["response_format"]
    kinds = [branch.get("properties", {}).get("type") for branch in response_format["anyOf"]]
    assert {"enum": ["text", "json_object"]} in kinds
    assert {"const": "json_schema"} in kinds
    content = bodies["ChatMessage"]["properties"]["content"]
    [parts] = [branch for branch in content["anyOf"] if branch.get("type") == "array"]
    kinds = [part["properties"]["type"] for part in parts["items"]["anyOf"]]
    assert kinds == [{"const": "text"}, {"const": "image_url"}]
    bias = bodies["CompletionRequest"]["properties"]["logit_bias"]["anyOf"][0]
    assert bias["additionalProperties"]["maximum"] == 100


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("logit_bias", {"5": -100}, True),
        ("logit_bias", {"5": 100.0}, True),
        ("logit_bias", {"5": -100.5}, False),
        ("logit_bias", {"5": 101}, False),
        ("logit_bias", {"x": 1}, False),
        ("logit_bias", None, True),
        ("best_of", 1, True),
        ("best_of", None, True),
        ("best_of", 2, False),
    ],
)
def test_hand_written_schemas_take_what_the_body_takes(schema: dict, field, value, valid):
    properties = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    assert jsonschema.Draft202012Validator(properties[field]).is_valid(value) == valid
    try:
        CompletionRequest.model_validate({"prompt": "Hi", field: value}).sampling_params(4)
    except (APIError, ValidationError, ParamsError):  # each a 400
        assert not valid
    else:
        assert valid


STRUCTURES = [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}]


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("structured_outputs", {"choice": ["a"]}, True),
        ("structured_outputs", {"choice": []}, False),
        ("structured_outputs", {}, False),
        ("structured_outputs", {"regex": "a", "other": 1}, False),
        (
            "response_format",
            {"type": "structural_tag", "structures": STRUCTURES, "triggers": ["<f"]},
            True,
        ),
        (
            "response_format",
            {"type": "structural_tag", "structures": [], "triggers": ["<f"]},
            False,
        ),
        (
            "response_format",
            {"type": "structural_tag", "structures": STRUCTURES, "triggers": []},
            False,
        ),
    ],
)
def test_constraint_schemas_take_what_the_body_takes(schema: dict, field, value, valid):
    """As above, for the constraint fields: the body refuses at reading the constraint
    (structured_output) or at making its grammar."""
    properties = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    assert jsonschema.Draft202012Validator(properties[field]).is_valid(value) == valid
    try:
        given = CompletionRequest.model_validate({"prompt": "Hi", field: value}).structured_output()
        grammar_text(given[1])
    except (APIError, ValueError):  # each a 400 (the engine names the field for grammar_text's)
        assert not valid
    else:
        assert valid


ROUTE_PROMPTS = [("/v1/completions", "prompt", {"max_tokens": 1}), ("/v1/embeddings", "input", {})]


@pytest.mark.parametrize("route", ROUTE_PROMPTS)
@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("a", True),
        ("", False),
        (["a"], True),
        (["a", "b"], True),
        ([], False),
        ([""], False),
        ([5], True),
        ([[5]], True),
        ([[5], [6, 7]], True),
        ([[]], False),
        ([[5], []], False),
        (["a", 5], False),
    ],
)
def test_prompt_schema_takes_what_the_server_takes(schema: dict, server, route, value, valid):
    """The prompt's hand-written schema against the real route: a 200 or a 400."""
    path, field, others = route
    properties = schema["components"]["schemas"][BODIES[path]]["properties"]
    assert jsonschema.Draft202012Validator(properties[field]).is_valid(value) == valid
    with server.client() as http:
        response = http.post(path, json={field: value, **others})
    assert response.status_code == (200 if valid else 400), response.text
