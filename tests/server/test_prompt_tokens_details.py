"""usage.prompt_tokens_details.cached_tokens (vLLM's --enable-prompt-tokens-details):
the prompt tokens the prefix cache held, on chat and completions answers, whole and
streamed; /v1/responses always gives them as input_tokens_details."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from tests.server.conftest import MODEL_NAME, LiveServer, start_server

BLOCK = 16  # the tiny server's KV block size
PROMPT = list(range(5, 45))  # 40 tokens: two full blocks before the last token


@pytest.fixture(scope="module")
def detailed(model_dir) -> Iterator[LiveServer]:
    live = start_server(model_dir, enable_prompt_tokens_details=True)
    yield live
    live.stop()


def full_blocks(prompt_tokens: int) -> int:
    """What a repeated prompt finds cached: its full blocks before its last token."""
    return (prompt_tokens - 1) // BLOCK * BLOCK


def completion(live: LiveServer, **fields) -> dict:
    body = {"model": MODEL_NAME, "max_tokens": 2, "temperature": 0, **fields}
    with live.client() as http:
        response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def streamed_usage(live: LiveServer, path: str, body: dict) -> dict:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with live.client() as http:
        lines = http.post(path, json=body).text.splitlines()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    return chunks[-1]["usage"]


def test_completions_count_a_repeated_prompts_cached_blocks(detailed):
    first = completion(detailed, prompt=PROMPT)["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    again = completion(detailed, prompt=PROMPT)["usage"]
    assert again["prompt_tokens_details"] == {"cached_tokens": 32}
    assert again["prompt_tokens"] == 40
    # Streamed: the final usage chunk.
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    assert streamed_usage(detailed, "/v1/completions", body)["prompt_tokens_details"] == {
        "cached_tokens": 32
    }
    # Several prompts: each one's cached tokens, summed (the new one had none).
    both = completion(detailed, prompt=[PROMPT, list(range(100, 140))], n=2)["usage"]
    assert both["prompt_tokens_details"] == {"cached_tokens": 32}


def test_chat_counts_them_through_the_sdk(detailed):
    client = openai.OpenAI(base_url=f"{detailed.url}/v1", api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "A question asked twice, word for word. " * 3}]
    kwargs = {"model": MODEL_NAME, "messages": messages, "max_tokens": 2, "temperature": 0}
    client.chat.completions.create(**kwargs)
    again = client.chat.completions.create(**kwargs).usage
    assert again.prompt_tokens > BLOCK
    assert again.prompt_tokens_details.cached_tokens == full_blocks(again.prompt_tokens)
    streamed = streamed_usage(detailed, "/v1/chat/completions", kwargs)
    assert streamed["prompt_tokens_details"] == {"cached_tokens": full_blocks(again.prompt_tokens)}


def test_without_the_flag_usage_has_no_details(server):
    for _ in range(2):
        usage = completion(server, prompt=PROMPT)["usage"]
    assert "prompt_tokens_details" not in usage


def test_responses_give_the_cached_input_tokens(server):
    body = {"model": MODEL_NAME, "input": "Tell me twice, the same words. " * 4}
    body |= {"max_output_tokens": 2, "temperature": 0}
    with server.client() as http:
        http.post("/v1/responses", json=body).raise_for_status()
        usage = http.post("/v1/responses", json=body).json()["usage"]
    assert usage["input_tokens"] > BLOCK
    assert usage["input_tokens_details"] == {"cached_tokens": full_blocks(usage["input_tokens"])}
