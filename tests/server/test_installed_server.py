"""The first minutes of a new user: `hetero-infer serve` with no model, started as the
README starts it (the installed console script, from a folder outside the checkout,
no PYTHONPATH), then the README's own requests, the chat page, tools on the embedded
model's template, and a clean stop."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from importlib import resources

import httpx
import openai
import pytest

from tests.server.conftest import REPO_ROOT, ServerProcess, spawn_installed

pytestmark = pytest.mark.slow

README = (REPO_ROOT / "README.md").read_text()
# The README's first request, answered the same way each time it is sent.
FIRST_REQUEST_RUNS = 10
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city today",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK_WEATHER = [{"role": "user", "content": "Weather in Paris?"}]


def readme_curl_body() -> dict:
    """The JSON body of the README's first curl."""
    match = re.search(
        r"curl http://127\.0\.0\.1:8000/v1/chat/completions.*?-d '(.*?)'", README, re.S
    )
    assert match, "the README's first request (a curl to /v1/chat/completions) is gone"
    return json.loads(match.group(1))


def readme_sdk_snippet() -> str:
    """The README's OpenAI SDK example."""
    match = re.search(r"```python\n(from openai import OpenAI\n.*?)```", README, re.S)
    assert match, "the README's OpenAI SDK example is gone"
    return match.group(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log_dir = tmp_path_factory.mktemp("installed")
    process = spawn_installed(
        ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"], log_dir
    )
    try:
        process.wait_ready(timeout=300)
        yield process
    finally:
        process.kill()


def test_the_readme_first_request_answers_its_question_every_time(server: ServerProcess):
    body = readme_curl_body()
    answers = [
        httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120).json()
        for _ in range(FIRST_REQUEST_RUNS)
    ]
    texts = [answer["choices"][0]["message"]["content"] for answer in answers]
    assert all("Paris" in text for text in texts), texts


def test_the_readme_sdk_example_prints_the_answer(server: ServerProcess):
    code = readme_sdk_snippet().replace("http://127.0.0.1:8000", server.url)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    assert "Paris" in printed.getvalue()


def test_the_models_names(server: ServerProcess):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)
    # The model's own name first (the one reported), and the project's.
    assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct", "hetero-infer"]


@pytest.mark.parametrize(
    ("path", "name", "media_type"),
    [
        ("/", "index.html", "text/html"),
        ("/static/chat.js", "chat.js", "text/javascript"),
        ("/static/chat.css", "chat.css", "text/css"),
    ],
)
def test_the_chat_page_and_its_assets(server: ServerProcess, path, name, media_type):
    response = httpx.get(server.url + path, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith(media_type)
    shipped = resources.files("hetero_infer.server").joinpath("static", name).read_bytes()
    assert response.content == shipped


def test_tools_reach_a_template_that_renders_none(server: ServerProcess):
    """SmolLM2's template ignores tools: they come in a generic tool prompt instead."""

    def tokens(**fields) -> list[int]:
        body = {"messages": ASK_WEATHER, **fields}
        response = httpx.post(f"{server.url}/tokenize", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()["tokens"]

    plain, with_tools = tokens(), tokens(tools=[WEATHER_TOOL])
    prompt = httpx.post(f"{server.url}/detokenize", json={"tokens": with_tools}, timeout=60).json()[
        "prompt"
    ]
    assert len(with_tools) > len(plain)
    assert "get_weather" in prompt and "<tool_call>" in prompt  # hermes's, the server's parser
    # The chat request's prompt is the one /tokenize shows.
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)
    reply = client.chat.completions.create(
        model="hetero-infer", messages=ASK_WEATHER, tools=[WEATHER_TOOL], max_tokens=8
    )
    assert reply.usage.prompt_tokens == len(with_tools)


def test_stops_cleanly_and_its_log_says_each_thing_once(server: ServerProcess):
    for _ in range(3):
        httpx.get(f"{server.url}/healthz", timeout=60)
    server.terminate()
    assert server.process.wait(timeout=60) == 0
    log = server.log()
    assert "KV cache:" in log and "max concurrency" in log
    # The CPU kernels came with the install: the first start compiles nothing.
    assert "CPU kernels ready" in log and "compiling the CPU kernels" not in log
    assert "default sampling values from the packaged model's card" in log
    # One line a request (ours, with its request id), none of Triton's at exit.
    assert len(re.findall(r"GET /healthz", log)) == 3, log
    assert "nanobind" not in log and "Traceback" not in log, log


def test_the_readme_gemma_example_completes_its_prompt(tmp_path):
    """Gemma-3-270M is a base model: the README shows it completing a prompt."""
    match = re.search(r"curl http://127\.0\.0\.1:8000/v1/completions.*?-d '(.*?)'", README, re.S)
    assert match, "the README's Gemma example (a curl to /v1/completions) is gone"
    assert "base model" in README
    process = spawn_installed(["--model", "gemma-3-270m"], tmp_path)
    try:
        process.wait_ready(timeout=300)
        response = httpx.post(
            f"{process.url}/v1/completions", json=json.loads(match.group(1)), timeout=120
        )
    finally:
        process.kill()
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"].startswith(" Paris")
