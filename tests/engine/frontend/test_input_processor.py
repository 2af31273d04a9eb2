"""InputProcessor's context rules at their edges: OpenAI's (the prompt and max_tokens
together fit in max_model_len, and the prompt leaves room for a token) and vLLM's
truncate_prompt_tokens; and the forms a prompt may take. The processor of a real engine
(a tiny random Llama, context 64)."""

from __future__ import annotations

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine
from hetero_infer.engine.frontend.input_processor import InputProcessor, PromptTokens
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


@pytest.mark.parametrize(("keep", "kept"), [(3, 3), (10, 10), (11, 10), (-1, 10)])
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


@pytest.mark.parametrize("prompt", [5, [1, "x"], [1, True], [1, 2.0], ""])
def test_a_prompt_is_text_or_token_ids(processor, prompt):
    """The engine's own callers reach this without the server's schema: anything else
    is a 400 naming the field, never a TypeError from deeper in."""
    with pytest.raises(ValidationError) as error:
        processor.tokenize(prompt, param="input")
    assert error.value.param == "input"
