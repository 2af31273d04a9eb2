"""Images through each API family's own client, against a served vision model: the
OpenAI, Anthropic and Ollama SDKs each send an image and get back the tokens
transformers' generate gives for it (tiny random SmolVLM, Gemma 3 and Qwen2.5-VL
checkpoints, fp32, greedy).
The same image as a data URL and as an http URL on 127.0.0.1 (allowed by
--allowed-media-domains) gives the same tokens.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import anthropic
import numpy as np
import ollama
import openai
import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine
from hetero_infer.server.serving import chat_images
from hetero_infer.server.serving.image_decode import decode_image
from PIL import Image

from tests.server.conftest import MODEL_NAME, LiveServer, start_server
from tests.server.local_origin import local_origin
from tests.tiny_models import (
    pil_processor,
    qwen2_5_vl_processor,
    save_tiny_gemma3_vision,
    save_tiny_idefics3,
    save_tiny_qwen2_5_vl,
)

MAX_TOKENS = 10
EOS = 2
QUESTION = "What is in this picture?"


def png_bytes(seed: int = 7) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (90, 140, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = png_bytes()
PNG_BASE64 = base64.b64encode(PNG).decode()


# Each family: its tiny checkpoint, transformers' class, the tokens that end an answer
# (Gemma's <end_of_turn>, Qwen's <|im_end|> too), transformers' processor.
AUTO = pil_processor
FAMILIES = {
    "idefics3": (save_tiny_idefics3, transformers.Idefics3ForConditionalGeneration, [EOS], AUTO),
    "gemma3": (
        save_tiny_gemma3_vision,
        transformers.Gemma3ForConditionalGeneration,
        [EOS, 385],
        AUTO,
    ),
    "qwen2_5_vl": (
        save_tiny_qwen2_5_vl,
        transformers.Qwen2_5_VLForConditionalGeneration,
        [EOS, 385],
        qwen2_5_vl_processor,
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def folder(tmp_path_factory, family):
    return FAMILIES[family][0](tmp_path_factory.mktemp(family))


def transformers_answer(folder: Path, family: str, **processor_kwargs) -> tuple[list[int], str]:
    """transformers' greedy answer (token ids, text) to QUESTION about the image, its
    processor called with ``processor_kwargs``."""
    _, model_class, eos, processor_of = FAMILIES[family]
    processor = processor_of(folder)
    model = model_class.from_pretrained(folder, dtype=torch.float32).eval()
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    image = Image.open(io.BytesIO(PNG)).convert("RGB")
    inputs = processor(
        text=text, images=[image], return_tensors="pt", add_special_tokens=False, **processor_kwargs
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=eos)
    tokens = out[0, inputs["input_ids"].shape[1] :].tolist()
    return tokens, processor.tokenizer.decode(tokens, skip_special_tokens=True)


@pytest.fixture(scope="module")
def reference(folder, family) -> tuple[list[int], str]:
    return transformers_answer(folder, family)


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    """An http server on 127.0.0.1 serving the PNG at /image.png."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            self.wfile.write(PNG)

        def log_message(self, *args) -> None:
            pass

    with local_origin(Handler) as url:
        yield f"{url}/image.png"


@pytest.fixture(scope="module")
def server(folder) -> Iterator[LiveServer]:
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    live = start_server(folder, engine, allowed_media_domains=("127.0.0.1",))
    yield live
    live.stop()


@pytest.mark.parametrize("source", ["data", "http"])
def test_openai_sdk_sends_an_image(server, reference, image_host, source):
    url = f"data:image/png;base64,{PNG_BASE64}" if source == "data" else image_host
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    answer = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert answer.choices[0].model_extra["token_ids"] == reference[0]


# Per family, a request's own mm_processor_kwargs (vLLM's field): smaller images, so
# fewer tokens, for two; other pixel values for Gemma's.
PROCESSOR_KWARGS = {
    "idefics3": {"size": {"longest_edge": 128}},
    "gemma3": {"image_mean": [0.25, 0.25, 0.25]},
    "qwen2_5_vl": {"max_pixels": 32 * 32},
}


def test_a_requests_processor_settings_reach_its_images_alone(server, reference, folder, family):
    """As transformers' processor called with the same keyword arguments answers; the
    same image without them, before and after, as the server's settings make it (the
    two preprocessings are two images to the recent images and the prefix cache)."""
    kwargs = PROCESSOR_KWARGS[family]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")

    def ask(**extra) -> tuple[list[int], int]:
        answer = client.chat.completions.create(
            model=MODEL_NAME,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{PNG_BASE64}"},
                        },
                        {"type": "text", "text": QUESTION},
                    ],
                }
            ],
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"return_token_ids": True, **extra},
        )
        return answer.choices[0].model_extra["token_ids"], answer.usage.prompt_tokens

    plain, own, again = ask(), ask(mm_processor_kwargs=kwargs), ask()
    assert plain == again and plain[0] == reference[0]
    assert own[0] == transformers_answer(folder, family, **kwargs)[0]
    if family != "gemma3":
        assert own[1] < plain[1]
    # the encoder's input; a mean of one letter; an image larger than the server makes it
    refused = [{"patch_size": 2}, {"image_mean": "x"}]
    refused += {
        "idefics3": [{"size": {"longest_edge": 4096}}],
        "qwen2_5_vl": [{"max_pixels": 4096**2}, {"min_pixels": 4096**2}],
    }.get(family, [])
    for bad in refused:
        with pytest.raises(openai.BadRequestError) as caught:
            ask(mm_processor_kwargs=bad)
        assert caught.value.body["param"] == "mm_processor_kwargs", bad


def test_anthropic_sdk_sends_an_image(server, reference):
    client = anthropic.Anthropic(base_url=server.url, api_key="none")
    answer = client.messages.create(
        model=MODEL_NAME,
        max_tokens=MAX_TOKENS,
        # (This SDK's create() takes no temperature of its own.)
        extra_body={"temperature": 0},
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG_BASE64},
                    },
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
    )
    assert answer.content[0].text == reference[1]


def test_ollama_sdk_sends_an_image(server, reference):
    client = ollama.Client(host=server.url)
    answer = client.chat(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": QUESTION, "images": [PNG_BASE64]}],
        options={"temperature": 0, "num_predict": MAX_TOKENS},
    )
    assert answer.message.content == reference[1]
    assert "vision" in client.show(MODEL_NAME).capabilities


def test_the_same_bytes_again_are_not_decoded_again(server, reference, monkeypatch):
    """A chat client sends its images again with every turn: bytes sent lately take the
    image preprocessed then, without decoding; other bytes get their own image."""
    decoded = []

    def counted(data: bytes, param: str) -> Image.Image:
        decoded.append(data)
        return decode_image(data, param)

    monkeypatch.setattr(chat_images, "decode_image", counted)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")

    def answer(png: bytes) -> list[int]:
        url = f"data:image/png;base64,{base64.b64encode(png).decode()}"
        image = {"type": "image_url", "image_url": {"url": url}}
        answer = client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        return answer.choices[0].model_extra["token_ids"]

    other = png_bytes(seed=8)
    first = answer(other)
    assert answer(other) == first
    assert decoded == [other]
    assert answer(PNG) == reference[0]  # not the image last seen


def test_a_private_address_is_refused_without_the_setting(folder, image_host):
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    live = start_server(folder, engine)
    try:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
        part = {"type": "image_url", "image_url": {"url": image_host}}
        with pytest.raises(openai.BadRequestError, match="messages.0.content.0"):
            client.chat.completions.create(
                model=MODEL_NAME,
                messages=[{"role": "user", "content": [part]}],
                max_tokens=2,
            )
    finally:
        live.stop()
