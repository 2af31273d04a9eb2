"""--limit-mm-per-prompt '{"image": 1}' on a served vision model (the tiny random
SmolVLM), through every family's routes: one image is answered; a second is a 400 in
the route's own error shape naming the second image's part, and no image of that
request is fetched, not even the first, which the limit lets through (an http URL on
127.0.0.1 that counts the requests reaching it). The images of an earlier response
count toward the limit of the one that continues it.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine
from PIL import Image

from tests.server.conftest import MODEL_NAME, LiveServer, start_server
from tests.server.local_origin import local_origin
from tests.server.openai_shapes import check_error_body
from tests.server.route_shapes import check_anthropic_error, check_ollama_error
from tests.tiny_models import save_tiny_idefics3

LIMIT = "at most 1 image(s) per prompt (--limit-mm-per-prompt), 2 given"


def png_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 30), (0, 90, 200)).save(out, format="PNG")
    return out.getvalue()


PNG = png_bytes()
PNG_BASE64 = base64.b64encode(PNG).decode()


class Origin(BaseHTTPRequestHandler):
    """Serves the PNG at any path, counting the requests."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def image_url() -> Iterator[str]:
    with local_origin(Origin) as url:
        yield f"{url}/image.png"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = save_tiny_idefics3(tmp_path_factory.mktemp("idefics3"))
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    live = start_server(
        folder, engine, allowed_media_domains=("127.0.0.1",), limit_mm_per_prompt='{"image": 1}'
    )
    yield live
    live.stop()


# Each family's body holding these images (http(s) or data URLs; Ollama's base64 only),
# the text between them.


def chat(urls: list[str]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "Look:"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"model": MODEL_NAME, "max_tokens": 1, "messages": [{"role": "user", "content": parts}]}


def tokenize(urls: list[str]) -> dict[str, Any]:
    return {k: v for k, v in chat(urls).items() if k != "max_tokens"}


def responses(urls: list[str]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "input_text", "text": "Look:"}]
    parts += [{"type": "input_image", "image_url": url} for url in urls]
    return {
        "model": MODEL_NAME,
        "max_output_tokens": 1,
        "input": [{"role": "user", "content": parts}],
    }


def anthropic(urls: list[str], count: bool = False) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": "Look:"}]
    blocks += [{"type": "image", "source": {"type": "url", "url": url}} for url in urls]
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": blocks}]}
    return body if count else {**body, "max_tokens": 1}


def ollama_chat(images: list[str]) -> dict[str, Any]:
    message = {"role": "user", "content": "Look", "images": images}
    return {
        "model": MODEL_NAME,
        "stream": False,
        "messages": [message],
        "options": {"num_predict": 1},
    }


def ollama_generate(images: list[str]) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "stream": False,
        "prompt": "Look",
        "images": images,
        "options": {"num_predict": 1},
    }


def openai_message(body: Any, param: str) -> str:
    error = check_error_body(body)
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    return error["message"]


def anthropic_message(body: Any, param: str) -> str:
    error = check_anthropic_error(body)
    assert error["type"] == "invalid_request_error", error
    return error["message"]


def ollama_message(body: Any, param: str) -> str:
    return check_ollama_error(body)


# (path, body of these images, the error's message from the answer, the second image's
# part, whether the body takes URLs)
Body = Callable[[list[str]], dict[str, Any]]
ROUTES: list[tuple[str, Body, Callable[[Any, str], str], str, bool]] = [
    ("/v1/chat/completions", chat, openai_message, "messages.0.content.2", True),
    ("/tokenize", tokenize, openai_message, "messages.0.content.2", True),
    ("/v1/responses", responses, openai_message, "input.0.content.2", True),
    ("/v1/messages", anthropic, anthropic_message, "messages.0.content.2", True),
    (
        "/v1/messages/count_tokens",
        lambda urls: anthropic(urls, count=True),
        anthropic_message,
        "messages.0.content.2",
        True,
    ),
    ("/api/chat", ollama_chat, ollama_message, "messages.0.images.1", False),
    ("/api/generate", ollama_generate, ollama_message, "images.1", False),
]


@pytest.mark.parametrize(
    ("path", "body", "message_of", "second", "urls"), ROUTES, ids=[r[0] for r in ROUTES]
)
def test_one_image_passes_and_a_second_is_refused_unfetched(
    server: LiveServer, image_url: str, path, body, message_of, second, urls
):
    image = image_url if urls else PNG_BASE64
    with server.client() as http:
        before = len(Origin.seen)
        response = http.post(path, json=body([image]))
        assert response.status_code == 200, response.text
        assert len(Origin.seen) == before + (1 if urls else 0)  # the one image was fetched
        data = f"data:image/png;base64,{PNG_BASE64}" if urls else PNG_BASE64
        for images in ([image, image], [data, image]):
            before = len(Origin.seen)
            response = http.post(path, json=body(images))
            assert response.status_code == 400, response.text
            message = message_of(response.json(), second)
            assert message == f"{second}: {LIMIT}", message
            assert len(Origin.seen) == before  # neither image was fetched
    assert server.engine.block_manager.num_used_blocks == 0


def test_an_earlier_responses_images_count_toward_the_limit(server: LiveServer, image_url: str):
    data = f"data:image/png;base64,{PNG_BASE64}"
    with server.client() as http:
        first = http.post("/v1/responses", json=responses([data]))
        assert first.status_code == 200, first.text
        before = len(Origin.seen)
        body = {**responses([image_url]), "previous_response_id": first.json()["id"]}
        response = http.post("/v1/responses", json=body)
        assert response.status_code == 400, response.text
        assert openai_message(response.json(), "input.0.content.1") == (
            f"input.0.content.1: {LIMIT}"
        )
        assert len(Origin.seen) == before
        text_only = {**responses([]), "previous_response_id": first.json()["id"]}
        assert http.post("/v1/responses", json=text_only).status_code == 200
