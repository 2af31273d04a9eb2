"""Images through every family's routes, against the real app and engine on the tiny
random Llama, which reads text only:

- an image gets a 400 in the route's own error shape, naming the image's part and
  saying the model takes no image input, before anything is fetched: an image URL
  costs such a server no request out, even to a host --allowed-media-domains lets it
  fetch from;
- made to take images by a stand-in for a vision model's part (its with_images records
  what it gets and grows the prompt as asked; a chat template writes "<image>" for
  each image part), every family's images reach InputProcessor.with_images decoded,
  preprocessed (by a stand-in that makes each its size) and in order, with the prompt
  the template wrote around their markers, and the prompt as with_images grows it is
  what the context and max_tokens are fitted to.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace
from typing import Any

import pytest
from hetero_infer.engine.frontend.input_processor import PromptTokens
from hetero_infer.engine.multimodal.recent_images import RecentImages
from PIL import Image

from tests.server.conftest import MAX_MODEL_LEN, MODEL_NAME, LiveServer, start_server
from tests.server.local_origin import local_origin
from tests.server.openai_shapes import check_error_body
from tests.server.route_shapes import check_anthropic_error, check_ollama_error

NO_IMAGES = "this model takes no image input"
NOT_STREAMED = ("/tokenize", "/v1/embeddings", "/v1/messages/count_tokens")
# Writes "<image>" for each image part.
TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}; {% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


# Two images told apart by their size.
SIZES = [(3, 1), (5, 1)]


def png_base64(size: tuple[int, int]) -> str:
    out = io.BytesIO()
    Image.new("RGB", size, (0, 90, 0)).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def data_url(size: tuple[int, int]) -> str:
    return f"data:image/png;base64,{png_base64(size)}"


class Recorder(BaseHTTPRequestHandler):
    """Answers nothing of use: it only counts the requests that reach it."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.seen.append(self.path)
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def image_url() -> Iterator[str]:
    with local_origin(Recorder) as url:
        yield f"{url}/cat.png"


@pytest.fixture(scope="module")
def server(model_dir) -> Iterator[LiveServer]:
    """The server, allowed to fetch from 127.0.0.1 (were the model not refusing images
    first, an image URL would reach the recorder), with the template above."""
    live = start_server(model_dir, allowed_media_domains=("127.0.0.1",), chat_template=TEMPLATE)
    yield live
    live.stop()


def chat_body(url: str) -> dict[str, Any]:
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": parts}], "max_tokens": 4}


def responses_body(url: str) -> dict[str, Any]:
    parts = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": url},
    ]
    return {"model": MODEL_NAME, "input": [{"role": "user", "content": parts}]}


def anthropic_body(url: str) -> dict[str, Any]:
    blocks = [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "url", "url": url}},
    ]
    return {"model": MODEL_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": blocks}]}


def openai_error(body: Any, param: str) -> str:
    error = check_error_body(body)
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    return error["message"]


def anthropic_error(body: Any, param: str) -> str:
    error = check_anthropic_error(body)
    assert error["type"] == "invalid_request_error", error
    return error["message"]


# (path, body of an image URL, the error's message from the answer, the part named)
ROUTES = [
    ("/v1/chat/completions", chat_body, openai_error, "messages.0.content.1"),
    ("/tokenize", chat_body, openai_error, "messages.0.content.1"),
    ("/v1/embeddings", chat_body, openai_error, "messages.0.content.1"),
    ("/v1/responses", responses_body, openai_error, "input.0.content.1"),
    ("/v1/messages", anthropic_body, anthropic_error, "messages.0.content.1"),
    ("/v1/messages/count_tokens", anthropic_body, anthropic_error, "messages.0.content.1"),
]


@pytest.mark.parametrize(("path", "body", "error_of", "param"), ROUTES, ids=[r[0] for r in ROUTES])
@pytest.mark.parametrize("url_kind", ["http", "data"])
def test_an_image_is_refused_before_any_fetch(
    server: LiveServer, image_url: str, path, body, error_of, param, url_kind
):
    url = image_url if url_kind == "http" else f"data:image/png;base64,{png_base64((2, 2))}"
    before = len(Recorder.seen)
    streams = (False,) if path in NOT_STREAMED else (False, True)
    with server.client() as http:
        for stream in streams:
            fields = body(url)
            if path in NOT_STREAMED:
                fields.pop("max_tokens", None)  # not a field of theirs
            else:
                fields["stream"] = stream
            response = http.post(path, json=fields)
            assert response.status_code == 400, response.text
            message = error_of(response.json(), param)
            assert message.startswith(param) and NO_IMAGES in message, message
    assert len(Recorder.seen) == before  # no request went out
    assert server.engine.block_manager.num_used_blocks == 0


def ollama_chat_body(image: str) -> dict[str, Any]:
    message = {"role": "user", "content": "What is this?", "images": [image]}
    return {"model": MODEL_NAME, "messages": [message]}


def ollama_generate_body(image: str) -> dict[str, Any]:
    return {"model": MODEL_NAME, "prompt": "What is this?", "images": [image]}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/api/chat", ollama_chat_body, "messages.0.images.0"),
        ("/api/generate", ollama_generate_body, "images.0"),
    ],
)
def test_ollama_refuses_an_image_in_its_shape(server: LiveServer, path, body, param):
    with server.client() as http:
        for stream in (False, True):
            response = http.post(path, json={**body(png_base64((2, 2))), "stream": stream})
            assert response.status_code == 400, response.text
            message = check_ollama_error(response.json())
            assert message.startswith(param) and NO_IMAGES in message, message
    assert server.engine.block_manager.num_used_blocks == 0


def test_a_text_only_request_is_answered_as_before(server: LiveServer):
    with server.client() as http:
        body = chat_body("x")
        body["messages"][0]["content"] = [{"type": "text", "text": "Hi"}]
        assert http.post("/v1/chat/completions", json=body).status_code == 200


# ---- a stand-in vision model ----


@dataclass
class StandInVision:
    """with_images of a vision model, as far as the server can tell: it records what it
    was given (its stand-in preprocess makes each image its size) and adds ``grow``
    tokens to a prompt with images."""

    grow: int = 0
    calls: list[tuple[str, list[tuple[int, int]], str]] = field(default_factory=list)
    tokenizer: Any = None

    def with_images(self, prompt: PromptTokens, images: list, param: str = "messages"):
        if not images:
            return prompt
        text = self.tokenizer.decode(prompt.token_ids)
        self.calls.append((text, list(images), param))
        return PromptTokens(None, prompt.token_ids + prompt.token_ids[-1:] * self.grow)


@pytest.fixture
def vision(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> StandInVision:
    stand_in = StandInVision(tokenizer=server.engine.tokenizer)
    # The routes ask whether the model has image prompts, look each image's bytes up in
    # their recent images (by its file's hash), and have each image preprocessed by them
    # off the event loop.
    prompts = SimpleNamespace(
        recent=RecentImages(),
        file_hash=lambda source: int.from_bytes(source[:8], "little"),
        preprocess=lambda image, source: image.size,
    )
    monkeypatch.setattr(server.engine.input_processor, "image_prompts", prompts)
    monkeypatch.setattr(server.engine.input_processor, "with_images", stand_in.with_images)
    return stand_in


def tokenize() -> dict[str, Any]:
    return {k: v for k, v in openai_chat().items() if k != "max_tokens"}


def embeddings() -> dict[str, Any]:
    return {**tokenize(), "add_generation_prompt": True}


def openai_chat() -> dict[str, Any]:
    parts = [
        {"type": "text", "text": "Is "},
        {"type": "image_url", "image_url": {"url": data_url(SIZES[0])}},
        {"type": "text", "text": " like "},
        {"type": "image_url", "image_url": {"url": data_url(SIZES[1])}},
        {"type": "text", "text": "?"},
    ]
    return {"model": MODEL_NAME, "max_tokens": 2, "messages": [{"role": "user", "content": parts}]}


def responses() -> dict[str, Any]:
    parts = [
        {"type": "input_text", "text": "Is "},
        {"type": "input_image", "image_url": data_url(SIZES[0])},
        {"type": "input_text", "text": " like "},
        {"type": "input_image", "image_url": data_url(SIZES[1])},
        {"type": "input_text", "text": "?"},
    ]
    return {
        "model": MODEL_NAME,
        "max_output_tokens": 2,
        "input": [{"role": "user", "content": parts}],
    }


def anthropic(count: bool = False) -> dict[str, Any]:
    def image(size: tuple[int, int]) -> dict[str, Any]:
        source = {"type": "base64", "media_type": "image/png", "data": png_base64(size)}
        return {"type": "image", "source": source}

    blocks = [
        {"type": "text", "text": "Is "},
        image(SIZES[0]),
        {"type": "text", "text": " like "},
        image(SIZES[1]),
        {"type": "text", "text": "?"},
    ]
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": blocks}]}
    return body if count else {**body, "max_tokens": 2}


def ollama_chat() -> dict[str, Any]:
    message = {"role": "user", "content": "Alike?", "images": [png_base64(s) for s in SIZES]}
    return {
        "model": MODEL_NAME,
        "stream": False,
        "messages": [message],
        "options": {"num_predict": 2},
    }


def ollama_generate() -> dict[str, Any]:
    images = [png_base64(s) for s in SIZES]
    return {
        "model": MODEL_NAME,
        "stream": False,
        "prompt": "Alike?",
        "images": images,
        "options": {"num_predict": 2},
    }


IN_TEXT = "user: Is <image> like <image>?; assistant:"
IMAGES_FIRST = "user: <image><image>Alike?; assistant:"
REACHING = [
    ("/v1/chat/completions", openai_chat, IN_TEXT),
    ("/tokenize", tokenize, IN_TEXT),
    ("/v1/embeddings", embeddings, IN_TEXT),
    ("/v1/responses", responses, IN_TEXT),
    ("/v1/messages", anthropic, IN_TEXT),
    ("/v1/messages/count_tokens", lambda: anthropic(count=True), IN_TEXT),
    ("/api/chat", ollama_chat, IMAGES_FIRST),
    ("/api/generate", ollama_generate, IMAGES_FIRST),
]


@pytest.mark.parametrize(("path", "body", "prompt"), REACHING, ids=[r[0] for r in REACHING])
def test_the_images_reach_with_images_in_order(server, vision, path, body, prompt):
    with server.client() as http:
        response = http.post(path, json=body())
    assert response.status_code == 200, response.text
    [(text, sizes, param)] = vision.calls
    assert text.endswith(prompt), text
    assert sizes == SIZES and param == "messages"
    assert server.engine.block_manager.num_used_blocks == 0


def test_the_grown_prompt_is_what_the_context_holds(server, vision):
    with server.client() as http:
        vision.grow = 100
        count = http.post("/v1/messages/count_tokens", json=anthropic(count=True)).json()
        tokens = http.post("/tokenize", json=tokenize()).json()
        assert count["input_tokens"] == tokens["count"]
        vision.grow = 0
        assert http.post("/v1/messages/count_tokens", json=anthropic(count=True)).json() == {
            "input_tokens": count["input_tokens"] - 100
        }
        vision.grow = MAX_MODEL_LEN  # the text fits; the images do not
        for path, body in (("/v1/chat/completions", openai_chat), ("/v1/messages", anthropic)):
            response = http.post(path, json=body())
            assert response.status_code == 400, response.text
            assert "maximum context length" in response.text
        response = http.post("/api/chat", json=ollama_chat())
        assert response.status_code == 400 and "context" in response.text
