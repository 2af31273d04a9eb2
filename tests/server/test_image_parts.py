"""Each API family's image parts -> the family-neutral ChatPlan: the same images in the
same order (ImageSource: each URL and the part's place in the family's own names),
and the same content parts for the chat template, an image as {"type": "image"} where
the family put it among the text. What a family cannot take is a 400 naming the part.
"""

from __future__ import annotations

from typing import Any

import pytest
from hetero_infer.server.anthropic.chat_translation import chat_plan
from hetero_infer.server.anthropic.chat_translation import image_sources as anthropic_images
from hetero_infer.server.anthropic.messages_request import MessagesRequest
from hetero_infer.server.errors import APIError
from hetero_infer.server.ollama.chat import image_sources as ollama_chat_images
from hetero_infer.server.ollama.chat import openai_messages
from hetero_infer.server.ollama.generate import image_sources as ollama_generate_images
from hetero_infer.server.ollama.request_bodies import ChatRequest, GenerateRequest
from hetero_infer.server.openai.chat_request import ChatCompletionRequest
from hetero_infer.server.openai.responses_api_items import (
    chat_messages,
    item_images,
    parse_items,
)
from hetero_infer.server.openai.responses_api_request import ResponsesRequest
from hetero_infer.server.serving.chat_images import ImageSource, image_sources
from hetero_infer.server.serving.chat_plan import ChatPlan
from pydantic import ValidationError

A = "data:image/png;base64,QUFB"
B = "https://example.com/b.png"
# The user's turn every family sends: text, image A, text, image B.
TEMPLATE_CONTENT = [
    {"type": "text", "text": "Compare "},
    {"type": "image"},
    {"type": "text", "text": " with "},
    {"type": "image"},
]
SYSTEM = {"role": "system", "content": "Be brief."}


def user_content(plan: ChatPlan) -> Any:
    return plan.template_messages()[-1]["content"]


def test_openai_chat():
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                SYSTEM,
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Compare "},
                        {"type": "image_url", "image_url": {"url": A, "detail": "low"}},
                        {"type": "text", "text": " with "},
                        {"type": "image_url", "image_url": {"url": B}},
                    ],
                },
            ],
        }
    )
    assert image_sources(body.messages) == [
        ImageSource(A, "messages.1.content.1"),
        ImageSource(B, "messages.1.content.3"),
    ]
    assert body.image_count() == 2
    assert user_content(body) == TEMPLATE_CONTENT
    assert body.template_messages()[0] == SYSTEM  # text-only messages stay strings


def test_responses_api():
    items = parse_items(
        [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Compare "},
                    {"type": "input_image", "image_url": A, "detail": "high"},
                    {"type": "input_text", "text": " with "},
                    {"type": "input_image", "image_url": B},
                ],
            },
        ]
    )
    assert item_images(items) == [
        ImageSource(A, "input.1.content.1"),
        ImageSource(B, "input.1.content.3"),
    ]
    plan = ResponsesRequest.model_validate({"model": "m", "input": "x"}).chat_request(
        chat_messages(items)
    )
    assert [s.url for s in image_sources(plan.messages)] == [A, B]
    assert user_content(plan) == TEMPLATE_CONTENT


def test_anthropic_messages():
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 5,
            "system": "Be brief.",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Compare "},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "QUFB"},
                        },
                        {"type": "text", "text": " with "},
                        {"type": "image", "source": {"type": "url", "url": B}},
                    ],
                }
            ],
        }
    )
    assert anthropic_images(body) == [
        ImageSource(A, "messages.0.content.1"),
        ImageSource(B, "messages.0.content.3"),
    ]
    plan = chat_plan(body)
    assert [s.url for s in image_sources(plan.messages)] == [A, B]
    assert user_content(plan) == TEMPLATE_CONTENT
    assert plan.template_messages()[0] == SYSTEM


def test_anthropic_tool_results_beside_images():
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": "Look"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": "done"},
                        {"type": "image", "source": {"type": "url", "url": B}},
                    ],
                },
            ],
        }
    )
    messages = chat_plan(body).template_messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages[-1]["content"] == [{"type": "image"}]
    assert anthropic_images(body) == [ImageSource(B, "messages.2.content.1")]


def test_ollama_chat():
    # Ollama gives a message's images beside its text: they go first.
    body = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Compare these", "images": ["QUFB", "QkJC"]},
            ],
        }
    )
    sources = ollama_chat_images(body.messages)
    assert sources == [
        ImageSource("data:;base64,QUFB", "messages.1.images.0"),
        ImageSource("data:;base64,QkJC", "messages.1.images.1"),
    ]
    plan = ChatPlan.model_validate({"messages": openai_messages(body.messages)})
    assert image_sources(plan.messages) == [
        ImageSource(s.url, f"messages.1.content.{k}") for k, s in enumerate(sources)
    ]
    assert user_content(plan) == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "Compare these"},
    ]


def test_ollama_images_only_in_a_users_message():
    body = ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "assistant", "content": "x", "images": ["QUFB"]}]}
    )
    with pytest.raises(APIError) as caught:
        ollama_chat_images(body.messages)
    assert caught.value.param == "messages.0.images"


def test_ollama_generate():
    body = GenerateRequest.model_validate(
        {"model": "m", "prompt": "What is it?", "images": ["QUFB"]}
    )
    assert ollama_generate_images(body) == [ImageSource("data:;base64,QUFB", "images.0")]
    for field in ({"raw": True}, {"context": [1, 2]}):
        with pytest.raises(APIError) as caught:
            ollama_generate_images(GenerateRequest.model_validate({**body.model_dump(), **field}))
        assert caught.value.param == "images" and next(iter(field)) in caught.value.message


# ---- refused ----


def chat_body(*parts: dict[str, Any], role: str = "user") -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": role, "content": list(parts)}]}


IMAGE = {"type": "image_url", "image_url": {"url": A}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (chat_body({"type": "input_audio", "input_audio": {}}), "'input_audio' are not supported"),
        (chat_body({"type": "image_url", "image_url": {}}), "image_url takes a url"),
        (chat_body({"type": "image_url", "image_url": "x"}), "an image part is"),
        (chat_body({"type": "image_url", "image_url": {"url": A, "detail": "x"}}), "detail"),
        (chat_body({"type": "text"}), "text part needs its text"),
        (chat_body(IMAGE, role="system"), "only a user message may hold images"),
        (chat_body(IMAGE, role="assistant"), "only a user message may hold images"),
    ],
)
def test_openai_parts_refused(body, message):
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(body)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("part", "role", "message"),
    [
        ({"type": "input_image", "file_id": "file-1"}, "user", "no files API"),
        ({"type": "input_image"}, "user", "needs its image_url"),
        ({"type": "input_image", "image_url": A}, "assistant", "only a user message"),
        ({"type": "input_file", "file_id": "f"}, "user", "input_image content parts"),
    ],
)
def test_responses_parts_refused(part, role, message):
    with pytest.raises(APIError) as caught:
        parse_items([{"role": role, "content": [part]}])
    assert caught.value.param.startswith("input.0") and message in caught.value.message


@pytest.mark.parametrize(
    "source",
    [
        {"type": "file", "file_id": "f"},
        {"type": "base64", "media_type": "image/tiff", "data": "QUFB"},
        {"type": "url"},
    ],
)
def test_anthropic_image_sources_refused(source):
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate(
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}],
            }
        )
