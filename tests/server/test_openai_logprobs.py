"""logprobs / top_logprobs in both OpenAI shapes, streamed and not, and echo (with prompt
logprobs), through the official `openai` client, against the engine run directly.
"""

from __future__ import annotations

import pytest
from hetero_infer.engine.entrypoints.llm_engine import LLMEngine
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.params.sampling_params import SamplingParams

from tests.server.conftest import MODEL_NAME

PROMPT = "Hello world and the"
MESSAGES = [{"role": "user", "content": "Hello there, is it working?"}]
MAX_TOKENS = 10


def run(engine: LLMEngine, prompt, **kw) -> RequestOutput:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, **kw)
    return engine.generate(prompt, params, use_tqdm=False)[0]


def complete(client, prompt: str | list = PROMPT, **kw):
    return client.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
        **kw,
    )


def test_completion_logprobs(client, reference_engine):
    expected = run(reference_engine, PROMPT, logprobs=3)
    out = complete(client, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(expected.token_ids) == out.usage.completion_tokens
    for i, (token_id, entry) in enumerate(zip(expected.token_ids, expected.logprobs, strict=True)):
        assert lp.token_logprobs[i] == pytest.approx(entry[token_id], abs=1e-5)
        assert len(lp.top_logprobs[i]) in (3, 4)
        assert max(lp.top_logprobs[i].values()) == pytest.approx(max(entry.values()), abs=1e-5)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_completion_logprobs_streamed_equal_the_whole(client):
    whole = complete(client, logprobs=2).choices[0].logprobs
    chunks = list(complete(client, logprobs=2, stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert sum((p.tokens for p in parts), []) == whole.tokens
    assert sum((p.token_logprobs for p in parts), []) == whole.token_logprobs
    assert sum((p.text_offset for p in parts), []) == whole.text_offset


def test_echo_with_prompt_logprobs(client, reference_engine):
    expected = run(reference_engine, PROMPT, logprobs=1, prompt_logprobs=1)
    n_prompt = len(expected.prompt_token_ids)
    out = complete(client, echo=True, logprobs=1)
    choice = out.choices[0]
    assert choice.text == PROMPT + expected.text
    assert out.usage.prompt_tokens == n_prompt
    assert out.usage.completion_tokens == len(expected.token_ids)
    lp = choice.logprobs
    assert len(lp.tokens) == n_prompt + len(expected.token_ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for p in range(1, n_prompt):
        token_id = expected.prompt_token_ids[p]
        want = expected.prompt_logprobs[p][token_id]
        assert lp.token_logprobs[p] == pytest.approx(want, abs=1e-5)
    # Without logprobs, echo is only the text; streamed, the prompt comes first.
    plain = complete(client, echo=True)
    assert plain.choices[0].text == choice.text and plain.choices[0].logprobs is None
    chunks = list(complete(client, echo=True, stream=True))
    assert chunks[0].choices[0].text.startswith(PROMPT)
    assert "".join(c.choices[0].text for c in chunks) == choice.text


def test_echo_of_a_token_id_prompt_is_its_text(client, reference_engine):
    """A prompt sent as token ids is echoed as their decode, whole and streamed."""
    ids = reference_engine.tokenizer.encode(PROMPT)
    expected = run(reference_engine, ids)
    out = complete(client, echo=True, prompt=ids)
    assert out.choices[0].text == reference_engine.tokenizer.decode(ids) + expected.text
    chunks = list(complete(client, echo=True, prompt=[ids, ids[:3]], stream=True))
    texts = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in (0, 1)]
    assert texts[0] == out.choices[0].text
    assert texts[1].startswith(reference_engine.tokenizer.decode(ids[:3]))


def test_chat_logprobs(client, reference_engine):
    ids = reference_engine.tokenizer.apply_chat_template(MESSAGES)
    expected = run(reference_engine, ids, logprobs=2)
    kw = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    out = client.chat.completions.create(
        logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True}, **kw
    )
    content = out.choices[0].logprobs.content
    assert len(content) == len(expected.token_ids) == out.usage.completion_tokens
    for item, token_id, entry in zip(content, expected.token_ids, expected.logprobs, strict=True):
        assert item.logprob == pytest.approx(entry[token_id], abs=1e-5)
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob == pytest.approx(max(entry.values()), abs=1e-5)
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert isinstance(item.bytes, list)
    stream = client.chat.completions.create(
        logprobs=True, top_logprobs=2, stream=True, extra_body={"ignore_eos": True}, **kw
    )
    streamed = [
        item for c in stream if c.choices and c.choices[0].logprobs
        for item in c.choices[0].logprobs.content
    ]  # fmt: skip
    assert [i.logprob for i in streamed] == [i.logprob for i in content]
    bare = client.chat.completions.create(logprobs=True, extra_body={"ignore_eos": True}, **kw)
    assert all(item.top_logprobs == [] for item in bare.choices[0].logprobs.content)
    none = client.chat.completions.create(extra_body={"ignore_eos": True}, **kw)
    assert none.choices[0].logprobs is None


def test_echo_logprobs_with_n_choices(client, reference_engine):
    expected = run(reference_engine, PROMPT, logprobs=1, prompt_logprobs=1)
    n_prompt = len(expected.prompt_token_ids)
    out = complete(client, echo=True, logprobs=1, n=2)
    assert [c.index for c in out.choices] == [0, 1]
    for choice in out.choices:
        assert choice.text == PROMPT + expected.text  # greedy: both choices agree
        lp = choice.logprobs
        assert len(lp.tokens) == n_prompt + len(expected.token_ids)
        assert lp.token_logprobs[:n_prompt] == out.choices[0].logprobs.token_logprobs[:n_prompt]
    assert out.usage.completion_tokens == 2 * len(expected.token_ids)
