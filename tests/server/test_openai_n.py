"""n > 1 choices and best_of through the official `openai` client: indices, seeds,
streaming, and usage summed over the choices."""

from __future__ import annotations

import openai
import pytest
from hetero_infer.engine.params.sampling_params import SamplingParams

from tests.server.conftest import MODEL_NAME

PROMPT = "Hello world and the"
MESSAGES = [{"role": "user", "content": "Hello there, is it working?"}]


def test_completion_n_with_seed_is_reproducible(client, reference_engine):
    kw = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=10, temperature=1.0, seed=5, n=4)
    first = client.completions.create(**kw, best_of=1, extra_body={"ignore_eos": True})
    again = client.completions.create(**kw, extra_body={"ignore_eos": True})
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in again.choices] and len(set(texts)) > 1
    params = SamplingParams(n=4, max_tokens=10, temperature=1.0, seed=5, ignore_eos=True)
    expected = reference_engine.generate(PROMPT, params, use_tqdm=False)
    assert texts == [o.text for o in expected]
    assert first.usage.completion_tokens == 40
    assert first.usage.prompt_tokens == len(expected[0].prompt_token_ids)


def test_completion_n_with_two_prompts_numbers_choices_per_prompt(client):
    out = client.completions.create(
        model=MODEL_NAME, prompt=[PROMPT, "the cat"], max_tokens=4, n=2, temperature=0
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.choices[0].text == out.choices[1].text  # greedy choices agree


def test_chat_n_streamed_equals_whole(client):
    kw = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=3, n=3)
    whole = client.chat.completions.create(**kw)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts = {0: "", 1: "", 2: ""}
    finished = set()
    stream = client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert [texts[i] for i in range(3)] == [c.message.content for c in whole.choices]
    assert finished == {0, 1, 2}
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_best_of_above_one_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(model=MODEL_NAME, prompt=PROMPT, n=2, best_of=3)
