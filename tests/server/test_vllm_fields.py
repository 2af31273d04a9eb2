"""vLLM's fields that training and evaluation tools send (TRL, verl, OpenRLHF, SkyRL,
lm-evaluation-harness), in vLLM's request and response shapes, against the engine run
directly: return_token_ids and return_tokens_as_token_ids."""

from __future__ import annotations

import json
from typing import Any

from hetero_infer.engine.llm_engine import LLMEngine
from hetero_infer.engine.outputs import RequestOutput
from hetero_infer.engine.sampling_params import SamplingParams

from tests.server.conftest import MODEL_NAME, LiveServer

PROMPT = "Hello world and the"
MESSAGES = [{"role": "user", "content": "Hello there, is it working?"}]
MAX_TOKENS = 12
GREEDY = {"model": MODEL_NAME, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}


def run(engine: LLMEngine, prompt: str | list[int], **kw: Any) -> RequestOutput:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, **kw)
    return engine.generate(prompt, params, use_tqdm=False)[0]


def post(server: LiveServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    with server.client() as http:
        response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def stream(server: LiveServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with server.client() as http, http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


# ---- return_token_ids ----


def test_completion_token_ids(server: LiveServer, reference_engine: LLMEngine):
    expected = run(reference_engine, PROMPT)
    body = {**GREEDY, "prompt": PROMPT, "return_token_ids": True}
    [choice] = post(server, "/v1/completions", body)["choices"]
    assert choice["prompt_token_ids"] == expected.prompt_token_ids
    assert choice["token_ids"] == expected.token_ids
    chunks = stream(server, "/v1/completions", body)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == expected.prompt_token_ids
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in chunks[1:])
    streamed = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert streamed == expected.token_ids
    without = post(server, "/v1/completions", {**GREEDY, "prompt": PROMPT})["choices"][0]
    assert "token_ids" not in without and "prompt_token_ids" not in without


def test_chat_token_ids(server: LiveServer, reference_engine: LLMEngine):
    prompt = reference_engine.tokenizer.apply_chat_template(MESSAGES)
    expected = run(reference_engine, prompt)
    body = {**GREEDY, "messages": MESSAGES, "return_token_ids": True}
    answer = post(server, "/v1/chat/completions", body)
    assert answer["prompt_token_ids"] == prompt
    assert answer["choices"][0]["token_ids"] == expected.token_ids
    chunks = stream(server, "/v1/chat/completions", body)
    assert chunks[0]["prompt_token_ids"] == prompt
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    streamed = [t for c in chunks[1:] for t in c["choices"][0]["token_ids"]]
    assert streamed == expected.token_ids


# ---- return_tokens_as_token_ids ----


def test_logprob_tokens_as_token_ids(server: LiveServer, reference_engine: LLMEngine):
    expected = run(reference_engine, PROMPT, logprobs=2)
    body = {**GREEDY, "prompt": PROMPT, "logprobs": 2, "return_tokens_as_token_ids": True}
    logprobs = post(server, "/v1/completions", body)["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in expected.token_ids]
    for entry, top in zip(expected.logprobs, logprobs["top_logprobs"], strict=True):
        assert set(top) == {f"token_id:{t}" for t in entry}
    chat = {**GREEDY, "messages": MESSAGES, "logprobs": True, "top_logprobs": 1}
    content = post(server, "/v1/chat/completions", {**chat, "return_tokens_as_token_ids": True})
    for item in content["choices"][0]["logprobs"]["content"]:
        assert item["token"].startswith("token_id:")
        assert item["bytes"] == list(item["token"].encode())
        assert item["top_logprobs"][0]["token"].startswith("token_id:")
