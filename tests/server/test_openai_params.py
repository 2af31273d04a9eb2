"""Sampling and stopping parameters through the official `openai` client, against the
engine run directly with the same SamplingParams: stop strings (streamed and not),
stop_token_ids, include_stop_str_in_output, min_tokens, ignore_eos, penalties,
logit_bias, seed, top_k and min_p. Usage must count exactly the tokens generated.
"""

from __future__ import annotations

import pytest
from hetero_infer.engine.entrypoints.llm_engine import LLMEngine
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.params.sampling_params import SamplingParams

from tests.server.conftest import MAX_MODEL_LEN, MODEL_NAME

PROMPT = "Hello world and the"
MESSAGES = [{"role": "user", "content": "Hello there, is it working?"}]
MAX_TOKENS = 16


def run(engine: LLMEngine, prompt: str | list[int], **kw) -> RequestOutput:
    params = SamplingParams(**{"max_tokens": MAX_TOKENS, "temperature": 0.0, **kw})
    return engine.generate(prompt, params, use_tqdm=False)[0]


def chat_ids(engine: LLMEngine) -> list[int]:
    return engine.tokenizer.apply_chat_template(MESSAGES)


def complete(client, **kw):
    return client.completions.create(
        **{"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, **kw}
    )


def check(choice_text: str, usage, expected: RequestOutput) -> None:
    assert choice_text == expected.text
    assert usage.prompt_tokens == len(expected.prompt_token_ids)
    assert usage.completion_tokens == len(expected.token_ids)


def test_stop_string(client, reference_engine):
    full = run(reference_engine, PROMPT, ignore_eos=True)
    stop = full.text[4:7]
    expected = run(reference_engine, PROMPT, ignore_eos=True, stop=[stop])
    assert expected.text == full.text[: full.text.find(stop)]
    out = complete(client, stop=stop, extra_body={"ignore_eos": True})
    check(out.choices[0].text, out.usage, expected)
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].model_extra["stop_reason"] == stop


def test_stop_list_streamed_with_the_stop_string_included(client, reference_engine):
    full = run(reference_engine, chat_ids(reference_engine), ignore_eos=True)
    stops = ["\u2603never", full.text[5:9]]
    expected = run(
        reference_engine,
        chat_ids(reference_engine),
        ignore_eos=True,
        stop=stops,
        include_stop_str_in_output=True,
    )
    assert expected.text.endswith(stops[1])
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stop=stops,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
    )
    *chunks, last = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == expected.text
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert last.usage.completion_tokens == len(expected.token_ids)


def test_stop_token_ids_and_min_tokens(client, reference_engine):
    full = run(reference_engine, PROMPT, ignore_eos=True)
    stop_id = full.token_ids[1]
    for extra in ({}, {"min_tokens": 6}):
        kw = {"ignore_eos": True, "stop_token_ids": [stop_id], **extra}
        expected = run(reference_engine, PROMPT, **kw)
        out = complete(client, extra_body=kw)
        check(out.choices[0].text, out.usage, expected)
        assert out.choices[0].finish_reason == expected.finish_reason
    assert len(expected.token_ids) >= 6


@pytest.mark.parametrize(
    "kw",
    [
        # Strong enough to change this model's greedy output in fp32 and bf16 alike.
        {"presence_penalty": 2.0},
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0, "frequency_penalty": 0.5},
        {"repetition_penalty": 1.8},
        {"logit_bias": {65: 100.0, 66: -50.0}},
    ],
    ids=["presence", "frequency", "both", "repetition", "logit_bias"],
)
def test_penalties_and_logit_bias_match_the_engine(client, reference_engine, kw):
    plain = run(reference_engine, PROMPT, ignore_eos=True)
    expected = run(reference_engine, PROMPT, ignore_eos=True, **kw)
    assert expected.token_ids != plain.token_ids  # the parameter does change the output
    sdk = {k: v for k, v in kw.items() if k in ("presence_penalty", "frequency_penalty")}
    extra = {"ignore_eos": True}
    if "repetition_penalty" in kw:
        extra["repetition_penalty"] = kw["repetition_penalty"]
    if "logit_bias" in kw:
        sdk["logit_bias"] = {str(k): v for k, v in kw["logit_bias"].items()}
    out = complete(client, extra_body=extra, **sdk)
    check(out.choices[0].text, out.usage, expected)
    if "logit_bias" in kw:
        assert set(expected.token_ids) == {65}


def test_chat_penalty(client, reference_engine):
    expected = run(reference_engine, chat_ids(reference_engine), frequency_penalty=1.0)
    out = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        frequency_penalty=1.0,
    )
    check(out.choices[0].message.content, out.usage, expected)


def test_seed_top_k_min_p(client, reference_engine):
    greedy = run(reference_engine, PROMPT, ignore_eos=True)
    seeded = [
        complete(client, temperature=1.0, seed=7, extra_body={"ignore_eos": True}) for _ in range(2)
    ]
    assert seeded[0].choices[0].text == seeded[1].choices[0].text
    expected = run(reference_engine, PROMPT, ignore_eos=True, temperature=1.0, seed=7)
    assert seeded[0].choices[0].text == expected.text
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        out = complete(client, temperature=1.0, extra_body={"ignore_eos": True, **extra})
        assert out.choices[0].text == greedy.text


def test_ignore_eos_runs_to_max_tokens(client):
    out = complete(client, max_tokens=24, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 24 and out.choices[0].finish_reason == "length"


def test_without_max_tokens_each_prompt_runs_to_its_own_context_end(client):
    """max_tokens null: each prompt of a request generates what its own context has
    left (vLLM's rule), the short one no less for sharing the request with a long one."""
    prompts = [[1, 300, 301], [1] + [300] * 400]
    extra = {"ignore_eos": True, "return_token_ids": True}
    out = complete(client, prompt=prompts, max_tokens=None, extra_body=extra)
    choices = sorted(out.choices, key=lambda choice: choice.index)
    generated = [len(choice.model_extra["token_ids"]) for choice in choices]
    assert generated == [MAX_MODEL_LEN - len(prompt) for prompt in prompts]
    assert [choice.finish_reason for choice in choices] == ["length", "length"]
    assert out.usage.completion_tokens == sum(generated)
