"""InputProcessor's context rules at their edges: OpenAI's (the prompt and max_tokens
together fit in max_model_len, and the prompt leaves room for a token) and vLLM's
truncate_prompt_tokens; and the forms a prompt may take. The processor of a real engine
(a tiny random Llama, context 64)."""

from __future__ import annotations

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.frontend.input_processor import InputProcessor, PromptTokens
from hetero_infer.engine.params.pooling_params import PoolingParams
from hetero_infer.engine.params.thinking_budget import ThinkingBudget
from hetero_infer.engine.settings.exceptions import ContextLengthError, ValidationError

from tests.tiny_models import save_tiny_model

CONTEXT = 64


@pytest.fixture(scope="module")
def processor(tmp_path_factory) -> InputProcessor:
    model_dir = save_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    config = EngineConfig(model=str(model_dir), max_model_len=CONTEXT, max_num_blocks=16)
    return LLMEngine(config).input_processor


def prompt_of(num_tokens: int) -> PromptTokens:
    return PromptTokens("some text", [5] * num_tokens)


def test_prompt_and_max_tokens_may_fill_the_context(processor):
    assert processor.fit_context(prompt_of(60), 4) == 4
    with pytest.raises(ContextLengthError, match="you requested 65 tokens") as error:
        processor.fit_context(prompt_of(60), 5)
    assert error.value.param == "max_tokens"


def test_without_max_tokens_the_prompt_leaves_room_for_one(processor):
    assert processor.fit_context(prompt_of(CONTEXT - 1), None) == 1
    with pytest.raises(ContextLengthError, match=f"requested {CONTEXT} tokens") as error:
        processor.fit_context(prompt_of(CONTEXT), None)
    assert error.value.param == "messages"


@pytest.mark.parametrize(("keep", "kept"), [(1, 1), (3, 3), (10, 10), (11, 10), (-1, 10)])
def test_truncate_keeps_the_last_tokens(processor, keep, kept):
    prompt = PromptTokens("text", list(range(1, 11)))
    cut = processor.truncate(prompt, keep)
    assert cut.token_ids == prompt.token_ids[-kept:]
    assert cut.text == (None if kept < 10 else "text")  # a prompt cut loses its text


def test_truncate_to_nothing_is_refused(processor):
    with pytest.raises(ValidationError, match="truncate_prompt_tokens"):
        processor.truncate(prompt_of(5), 0)


def test_an_embedding_input_may_fill_the_context(processor):
    assert processor.embedding_request("e", prompt_of(CONTEXT)).pooling is not None
    with pytest.raises(ContextLengthError, match=f"the input has {CONTEXT + 1} tokens"):
        processor.embedding_request("e", prompt_of(CONTEXT + 1))


def test_an_embedding_request_carries_its_pooling_and_priority(processor):
    request = processor.embedding_request("e", prompt_of(3), normalize=False)
    assert request.pooling == PoolingParams("last", normalize=False)
    assert processor.embedding_request("e", prompt_of(3)).pooling == PoolingParams("last")
    # As a generation's: another priority than 0 needs the priority policy.
    with pytest.raises(ValidationError, match="needs priority scheduling") as error:
        processor.embedding_request("e", prompt_of(3), priority=1)
    assert error.value.param == "priority"


@pytest.mark.parametrize("prompt", [5, [1, "x"], [1, True], [1, 2.0], ""])
def test_a_prompt_is_text_or_token_ids(processor, prompt):
    """The engine's own callers reach this without the server's schema: anything else
    is a 400 naming the field, never a TypeError from deeper in."""
    with pytest.raises(ValidationError) as error:
        processor.tokenize(prompt, param="input")
    assert error.value.param == "input"


def test_token_ids_are_in_the_vocabulary(processor):
    last = processor.vocab_size - 1
    assert processor.tokenize([0, last]).token_ids == [0, last]
    for bad in ([processor.vocab_size], [-1]):
        with pytest.raises(ValidationError, match=f"token id {bad[0]} is outside") as error:
            processor.tokenize(bad, param="input")
        assert error.value.param == "input"


def test_a_text_model_takes_no_images(processor):
    prompt = prompt_of(3)
    assert processor.with_images(prompt, []) is prompt
    with pytest.raises(ValidationError, match=r"takes no image input \(1 image") as error:
        processor.with_images(prompt, [object()], param="input")
    assert error.value.param == "input"


def test_a_bad_word_is_banned_where_a_text_starts_and_after_a_space(processor):
    """Its tokens as they start a text and as they follow a space (no BOS: the words
    come in the middle of an output), each once."""
    encode = processor.tokenizer.encode
    alone, spaced = encode("hi", add_special_tokens=False), encode(" hi", add_special_tokens=False)
    assert alone != spaced
    assert processor.bad_words_token_ids(["hi", " hi"]) == [alone, spaced]


def test_thinking_marks_are_their_tokens_within_a_text(processor):
    budget = ThinkingBudget.for_marks(5, "<think>", "</think>", processor.tokenizer)
    encode = processor.tokenizer.encode
    assert budget.tokens == 5
    assert budget.start == tuple(encode("<think>", add_special_tokens=False))
    assert budget.end == tuple(encode("</think>", add_special_tokens=False))


def test_the_engines_own_prompt_may_fill_the_context(processor):
    """LLMEngine.add_request's rule: the prompt fits, max_tokens may run past it."""
    assert processor.request("r", prompt_of(CONTEXT), SamplingParams(max_tokens=8))
    with pytest.raises(ValidationError, match=f"{CONTEXT + 1} tokens is longer") as error:
        processor.request("r", prompt_of(CONTEXT + 1), SamplingParams())
    assert error.value.param == "prompt"


def test_a_thinking_budget_cannot_be_used_with_a_constrained_output(processor):
    budget = ThinkingBudget.for_marks(5, "<think>", "</think>", processor.tokenizer)
    thinking = processor.request("r", prompt_of(3), SamplingParams(thinking_budget=budget))
    assert thinking.params.thinking_budget == budget
    params = SamplingParams(thinking_budget=budget, json_schema={"type": "object"})
    with pytest.raises(ValidationError, match="cannot be used with format") as error:
        processor.request("r", prompt_of(3), params, schema_param="format")
    assert error.value.param == "thinking_token_budget"
