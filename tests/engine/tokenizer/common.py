"""What the tokenizer and detokenizer tests share: texts, text strategies, and the tiny
byte-fallback tokenizer."""

from __future__ import annotations

import functools

from hetero_infer.engine.tokenizer import Tokenizer
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.helpers import FIRST_BYTE_TOKEN_ID, make_byte_fallback_tokenizer

SMOLLM2_VOCAB_SIZE = 49152

# Text that exercises every path: real pieces, 2-, 3- and 4-byte characters, a ZWJ
# sequence, whitespace that falls back to bytes.
MIXED_TEXT = "Hello world! naïve café — 你好，世界 😀🎉👍🏽 日本語 👨‍👩‍👧 ∑x\n\tend."

PROPERTY_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ASCII pieces plus characters of every UTF-8 length; "▁" (decodes as a space) and "<"
# (could spell a special token) are left out so that text round-trips.
TEXT_ALPHABET = st.one_of(
    st.sampled_from(list("Hello world, the is and at ")),
    st.sampled_from(list("éïñ—中文字日本😀🎉👍🏽\u200d\n\t")),
    st.characters(codec="utf-8", exclude_characters="▁<"),
)
TEXT = st.text(alphabet=TEXT_ALPHABET, max_size=12)


@functools.cache
def byte_fallback() -> Tokenizer:
    return Tokenizer(make_byte_fallback_tokenizer())


def byte_tokens(data: bytes) -> list[int]:
    return [FIRST_BYTE_TOKEN_ID + b for b in data]
