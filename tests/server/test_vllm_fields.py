"""vLLM's fields that training and evaluation tools send (TRL, verl, OpenRLHF, SkyRL,
lm-evaluation-harness), in vLLM's request and response shapes, against the engine run
directly: return_token_ids, return_tokens_as_token_ids, request_id,
truncate_prompt_tokens, add_special_tokens, add_generation_prompt with
continue_final_message and echo, reasoning_effort, cache_salt, allowed_token_ids,
bad_words, prompt_logprobs and thinking_token_budget."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import transformers
from hetero_infer.engine.entrypoints.llm_engine import LLMEngine
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.params.sampling_params import SamplingParams

from tests.server.conftest import MODEL_NAME, LiveServer, make_engine, start_server

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
    # Several choices, drawn: each its own ids, those of its own text.
    drawn = {**body, "n": 3, "temperature": 1.0, "seed": 7}
    choices = post(server, "/v1/chat/completions", drawn)["choices"]
    decoded = [reference_engine.tokenizer.decode(c["token_ids"]) for c in choices]
    assert decoded == [c["message"]["content"] for c in choices]
    assert len(set(decoded)) > 1


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


# ---- request_id ----


def test_request_id_names_the_answer(server: LiveServer):
    completion = post(server, "/v1/completions", {**GREEDY, "prompt": PROMPT, "request_id": "r-7"})
    assert completion["id"] == "cmpl-r-7"
    chat = {**GREEDY, "messages": MESSAGES, "request_id": "r-8"}
    assert post(server, "/v1/chat/completions", chat)["id"] == "chatcmpl-r-8"
    assert {c["id"] for c in stream(server, "/v1/chat/completions", chat)} == {"chatcmpl-r-8"}
    with server.client() as http:
        too_long = http.post(
            "/v1/completions", json={**GREEDY, "prompt": PROMPT, "request_id": "x" * 300}
        )
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "request_id"


# ---- skip_special_tokens, spaces_between_special_tokens ----


def test_special_token_flags_reach_the_text(server: LiveServer, reference_engine: LLMEngine):
    """The tiny model's byte-level tokenizer puts no space between added tokens, so the
    text is the engine's with either flag (test_added_tokens_as_written.py has one that
    does); both flags are taken (vLLM's clients send them)."""
    flags = {"skip_special_tokens": False, "spaces_between_special_tokens": False}
    expected = run(reference_engine, PROMPT, **flags).text
    [choice] = post(server, "/v1/completions", {**GREEDY, "prompt": PROMPT, **flags})["choices"]
    assert choice["text"] == expected


# ---- truncate_prompt_tokens ----


def test_truncate_prompt_tokens_keeps_the_last_ones(server: LiveServer, reference_engine):
    ids = reference_engine.tokenizer.encode(PROMPT)
    expected = run(reference_engine, ids[-3:])
    body = {**GREEDY, "prompt": PROMPT, "truncate_prompt_tokens": 3}
    answer = post(server, "/v1/completions", body)
    assert answer["usage"]["prompt_tokens"] == 3
    assert answer["choices"][0]["text"] == expected.text
    chat = post(
        server,
        "/v1/chat/completions",
        {**GREEDY, "messages": MESSAGES, "truncate_prompt_tokens": 4},
    )
    assert chat["usage"]["prompt_tokens"] == 4
    whole = post(
        server, "/v1/completions", {**GREEDY, "prompt": PROMPT, "truncate_prompt_tokens": -1}
    )
    assert whole["usage"]["prompt_tokens"] == len(ids)


def test_add_special_tokens_false_leaves_the_prompt_as_sent(server, reference_engine):
    """For a prompt rendered by the client (a chat template's text), whose BOS is in it."""
    bare = reference_engine.tokenizer.encode(PROMPT, add_special_tokens=False)
    assert bare != reference_engine.tokenizer.encode(PROMPT)  # the tokenizer adds a BOS
    expected = run(reference_engine, bare)
    body = {**GREEDY, "prompt": PROMPT, "add_special_tokens": False, "echo": True}
    answer = post(server, "/v1/completions", body)
    assert answer["usage"]["prompt_tokens"] == len(bare)
    assert answer["choices"][0]["text"] == PROMPT + expected.text
    cut = post(server, "/v1/completions", {**body, "truncate_prompt_tokens": 2})
    assert cut["usage"]["prompt_tokens"] == 2


def test_chat_add_special_tokens_puts_the_tokenizers_around_the_template(
    server: LiveServer, reference_engine: LLMEngine
):
    """vLLM's add_special_tokens on a chat (false by default): the tokenizer's BOS before
    the template's own; /tokenize counts the same, a prompt still with its BOS."""
    tokenizer = reference_engine.tokenizer
    templated = tokenizer.apply_chat_template(MESSAGES)
    prompt = [*tokenizer.encode("x")[:1], *templated]  # the BOS, then the template's
    assert prompt[0] == tokenizer.hf_tokenizer.bos_token_id
    body = {**GREEDY, "messages": MESSAGES, "return_token_ids": True}
    answer = post(server, "/v1/chat/completions", {**body, "add_special_tokens": True})
    assert answer["prompt_token_ids"] == prompt
    assert answer["choices"][0]["token_ids"] == run(reference_engine, prompt).token_ids
    assert post(server, "/v1/chat/completions", body)["prompt_token_ids"] == templated
    counted = {"model": MODEL_NAME, "messages": MESSAGES}
    assert post(server, "/tokenize", counted)["tokens"] == templated
    assert post(server, "/tokenize", {**counted, "add_special_tokens": True})["tokens"] == prompt
    bare = {"model": MODEL_NAME, "prompt": PROMPT}
    assert post(server, "/tokenize", bare)["tokens"] == tokenizer.encode(PROMPT)
    assert post(server, "/tokenize", {**bare, "add_special_tokens": False})["tokens"] == (
        tokenizer.encode(PROMPT, add_special_tokens=False)
    )


# ---- add_generation_prompt, continue_final_message, echo, reasoning_effort ----

PREFILLED = [*MESSAGES, {"role": "assistant", "content": "Yes, it is"}]
CONTINUED = {"add_generation_prompt": False, "continue_final_message": True}


def test_chat_echo_starts_with_the_continued_message(server: LiveServer):
    body = {**GREEDY, "messages": PREFILLED, **CONTINUED}
    plain = post(server, "/v1/chat/completions", body)["choices"][0]["message"]["content"]
    echoed = post(server, "/v1/chat/completions", {**body, "echo": True})
    assert echoed["choices"][0]["message"]["content"] == "Yes, it is" + plain
    chunks = stream(server, "/v1/chat/completions", {**body, "echo": True})
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0]["role"] == "assistant" and deltas[1] == {"content": "Yes, it is"}
    assert "".join(d.get("content", "") for d in deltas) == "Yes, it is" + plain
    # The last message is the user's: nothing to echo.
    fresh = {**GREEDY, "messages": MESSAGES}
    alone = post(server, "/v1/chat/completions", fresh)["choices"][0]["message"]["content"]
    answer = post(server, "/v1/chat/completions", {**fresh, "echo": True})
    assert answer["choices"][0]["message"]["content"] == alone


def test_continue_final_message(server: LiveServer, reference_engine):
    tokenizer = reference_engine.tokenizer
    prompt = tokenizer.apply_chat_template(
        PREFILLED, add_generation_prompt=False, continue_final_message=True
    )
    assert tokenizer.decode(prompt).endswith("Yes, it is")
    body = {**GREEDY, "messages": PREFILLED, "return_token_ids": True}
    answer = post(server, "/v1/chat/completions", {**body, **CONTINUED})
    assert answer["prompt_token_ids"] == prompt
    assert answer["choices"][0]["message"]["content"] == run(reference_engine, prompt).text
    with server.client() as http:
        both = http.post("/v1/chat/completions", json={**body, "continue_final_message": True})
        not_assistant = http.post(
            "/v1/chat/completions",
            json={
                **GREEDY,
                "messages": MESSAGES,
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
        )
    for refused in (both, not_assistant):
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "continue_final_message"


EFFORT_TEMPLATE = (
    "<s>{% if reasoning_effort is defined %}effort: {{ reasoning_effort }}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def test_reasoning_effort_reaches_the_template(model_dir):
    live = start_server(model_dir, chat_template=EFFORT_TEMPLATE)
    try:
        body = {
            **GREEDY,
            "messages": MESSAGES,
            "return_token_ids": True,
            "reasoning_effort": "high",
        }
        prompt = post(live, "/v1/chat/completions", body)["prompt_token_ids"]
        assert live.engine.tokenizer.decode(prompt).startswith("effort: high\n")
        kwargs = {**body, "chat_template_kwargs": {"reasoning_effort": "low"}}  # its own win
        low = post(live, "/v1/chat/completions", kwargs)["prompt_token_ids"]
        assert live.engine.tokenizer.decode(low).startswith("effort: low\n")
        with live.client() as http:
            bad = http.post("/v1/chat/completions", json={**body, "reasoning_effort": "max"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"
        # /v1/responses' reasoning.effort is the same (as vLLM maps it): its prompt is
        # the chat route's, echoed in the response.
        reasoning = {"effort": "high", "summary": "auto"}
        answer = {"model": MODEL_NAME, "input": MESSAGES, "max_output_tokens": 1}
        response = post(live, "/v1/responses", {**answer, "reasoning": reasoning})
        assert response["usage"]["input_tokens"] == len(prompt)
        assert response["reasoning"] == reasoning
        plain = post(live, "/v1/responses", answer)
        assert plain["usage"]["input_tokens"] < len(prompt) and plain["reasoning"] is None
    finally:
        live.stop()


# ---- cache_salt ----

# Three full blocks of 16 tokens and a few more.
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 2


def test_cache_salt_keeps_cached_blocks_to_its_own(server: LiveServer):
    engine = server.engine

    def hits_after(**fields: Any) -> int:
        before = engine.memory_stats()["prefix_cache_hits"]
        body = {**GREEDY, "max_tokens": 1, "prompt": LONG_PROMPT, **fields}
        post(server, "/v1/completions", body)
        return engine.memory_stats()["prefix_cache_hits"] - before

    hits_after()  # the unsalted blocks are cached
    assert hits_after() > 0
    assert hits_after(cache_salt="tenant-a") == 0  # salted: none of the unsalted ones
    assert hits_after(cache_salt="tenant-a") > 0  # its own, the second time
    assert hits_after(cache_salt="tenant-b") == 0
    with server.client() as http:
        empty = http.post("/v1/completions", json={**GREEDY, "prompt": PROMPT, "cache_salt": ""})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "cache_salt"


# ---- allowed_token_ids, bad_words ----


def test_allowed_token_ids(server: LiveServer, reference_engine: LLMEngine):
    free = run(reference_engine, PROMPT)
    # Not the tokens it picks freely: the output must change, and hold only these.
    allowed = [t for t in range(3, 60) if t not in free.token_ids][:5]
    expected = run(reference_engine, PROMPT, allowed_token_ids=allowed)
    assert set(expected.token_ids) <= set(allowed) and expected.token_ids != free.token_ids
    for sampled in ({}, {"temperature": 1.0, "seed": 3}):
        body = {**GREEDY, "prompt": PROMPT, "allowed_token_ids": allowed, "return_token_ids": True}
        [choice] = post(server, "/v1/completions", {**body, **sampled})["choices"]
        assert set(choice["token_ids"]) <= set(allowed)
        if not sampled:
            assert choice["token_ids"] == expected.token_ids
    with server.client() as http:
        outside = http.post(
            "/v1/completions", json={**GREEDY, "prompt": PROMPT, "allowed_token_ids": [10**6]}
        )
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "allowed_token_ids"


def test_bad_words(server: LiveServer, reference_engine: LLMEngine):
    """With " a" favoured over everything and "a" next, the output is " a a a...";
    "a a" as a bad word excludes " a" after every " a" (a word's last token, where the
    rest of it ends the output), so "a" comes between them."""
    encode = reference_engine.tokenizer.encode
    spaced, plain = (
        encode(" a", add_special_tokens=False)[-1],
        encode("aa", add_special_tokens=False)[-1],
    )
    bias = {spaced: 100.0, plain: 90.0}
    assert run(reference_engine, PROMPT, logit_bias=bias).token_ids == [spaced] * MAX_TOKENS
    expected = run(reference_engine, PROMPT, logit_bias=bias, bad_words=["a a"])
    assert expected.token_ids == [spaced, plain] * (MAX_TOKENS // 2)
    body = {
        **GREEDY,
        "prompt": PROMPT,
        "logit_bias": {str(t): b for t, b in bias.items()},
        "bad_words": ["a a"],
        "return_token_ids": True,
    }
    [choice] = post(server, "/v1/completions", body)["choices"]
    assert choice["token_ids"] == expected.token_ids


# ---- prompt_logprobs ----


def test_prompt_logprobs_with_ranks(model_dir):
    """Each prompt token's logprob and rank, and its alternatives', as transformers
    computes them on the same fp32 weights."""
    live = start_server(model_dir, engine=make_engine(model_dir, dtype="float32"))
    try:
        ids = live.engine.tokenizer.encode(PROMPT)
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        with torch.no_grad():
            expected = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        body = {**GREEDY, "prompt": PROMPT, "prompt_logprobs": 2}
        [choice] = post(live, "/v1/completions", body)["choices"]
        [first] = stream(live, "/v1/completions", body)[:1]
        chat = {**GREEDY, "messages": MESSAGES, "prompt_logprobs": 1}
        chat_logprobs = post(live, "/v1/chat/completions", chat)["prompt_logprobs"]
    finally:
        live.stop()
    shown = choice["prompt_logprobs"]
    assert first["choices"][0]["prompt_logprobs"] == shown
    assert len(shown) == len(ids) and shown[0] is None
    for position, entry in enumerate(shown[1:]):
        row, token = expected[position], ids[position + 1]
        top = row.topk(2).indices.tolist()
        assert set(entry) == {str(t) for t in [token, *top]}
        assert next(iter(entry)) == str(token)  # the prompt token first, as vLLM's
        for key, item in entry.items():
            t = int(key)
            assert item["logprob"] == pytest.approx(float(row[t]), abs=1e-4)
            assert item["rank"] == int((row > row[t]).sum()) + 1
            assert item["decoded_token"] == live.engine.tokenizer.decode(
                [t], skip_special_tokens=False
            )
    assert chat_logprobs[0] is None and all(len(e) in (1, 2) for e in chat_logprobs[1:])


# ---- thinking_token_budget ----


def test_thinking_token_budget_forces_the_end_mark(model_dir, server, reference_engine):
    """A prompt that opens the thinking (as DeepSeek-R1's template does), a budget of 3:
    the model's own 3 tokens, then </think> whatever the model prefers, then the model
    going on from there as it would from those tokens."""
    tokenizer = reference_engine.tokenizer
    end = tokenizer.encode("</think>", add_special_tokens=False)
    prompt = tokenizer.encode(PROMPT) + tokenizer.encode("<think>", add_special_tokens=False)
    free = run(reference_engine, prompt).token_ids
    assert free[3 : 3 + len(end)] != end
    body = {**GREEDY, "prompt": prompt, "thinking_token_budget": 3, "return_token_ids": True}
    live = start_server(model_dir, reasoning_parser="deepseek_r1")
    try:
        [choice] = post(live, "/v1/completions", body)["choices"]
        streamed = stream(live, "/v1/completions", body)
        chat = {**GREEDY, "messages": MESSAGES, "thinking_token_budget": 3}
        with live.client() as http:
            constrained = http.post(
                "/v1/chat/completions", json={**chat, "response_format": {"type": "json_object"}}
            )
    finally:
        live.stop()
    out = choice["token_ids"]
    assert out[:3] == free[:3] and out[3 : 3 + len(end)] == end
    after = run(reference_engine, prompt + out[: 3 + len(end)]).token_ids
    assert out[3 + len(end) :] == after[: len(out) - 3 - len(end)]
    assert [t for c in streamed for t in c["choices"][0]["token_ids"]] == out
    # A constrained output has no thinking to end; without a reasoning parser the
    # server knows no thinking marks: both a 400 naming the field.
    with server.client() as http:
        unmarked = http.post("/v1/completions", json=body)
    for response in (constrained, unmarked):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "thinking_token_budget"


# A template that opens the thinking in the prompt, as DeepSeek-R1's does.
THINK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: <think>\n{% endif %}"
)


def test_usage_counts_the_thinking_tokens(model_dir, reference_engine):
    """With a reasoning parser, usage.completion_tokens_details.reasoning_tokens (OpenAI's)
    counts the output's thinking: its tokens through the end mark the budget forced,
    whole or streamed (with continuous usage, every chunk so far); for n choices, all
    of theirs."""
    end = reference_engine.tokenizer.encode("</think>", add_special_tokens=False)
    live = start_server(model_dir, reasoning_parser="deepseek_r1", chat_template=THINK_TEMPLATE)
    body = {**GREEDY, "messages": MESSAGES, "thinking_token_budget": 3}
    options = {"include_usage": True, "continuous_usage_stats": True}
    try:
        whole = post(live, "/v1/chat/completions", {**body, "n": 2, "return_token_ids": True})
        chunks = stream(live, "/v1/chat/completions", {**body, "stream_options": options})
    finally:
        live.stop()
    ids = whole["choices"][0]["token_ids"]
    thinking = next(i + len(end) for i in range(len(ids)) if ids[i : i + len(end)] == end)
    assert 3 <= thinking < len(ids)  # the budget ended it, and an answer followed
    assert whole["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2 * thinking}
    so_far = [c["usage"]["completion_tokens_details"]["reasoning_tokens"] for c in chunks]
    assert so_far == sorted(so_far) and so_far[0] < so_far[-1] == thinking
