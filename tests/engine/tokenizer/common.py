"""What the tokenizer and detokenizer tests share: texts, text strategies, the tiny
byte-fallback and WordPiece tokenizers, and a stream checked as it goes."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import tokenizers
from hetero_infer.engine.tokenizer import Detokenizer, IncrementalDetokenizer, Tokenizer
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

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


def stream_deltas(
    tokenizer: Tokenizer,
    prompt: list[int],
    ids: list[int],
    chunk_sizes: list[int],
    skip_special_tokens: bool,
    expected: str,
    make: Callable[[Tokenizer, list[int], bool], Detokenizer] = IncrementalDetokenizer,
) -> list[str]:
    """Feeds ids in chunks to the detokenizer ``make`` gives, checking the prefix
    property after each; returns the deltas."""
    detok = make(tokenizer, prompt, skip_special_tokens)
    deltas: list[str] = []
    sent = ""
    pos = 0
    for size in itertools.cycle(chunk_sizes):
        if pos >= len(ids):
            break
        deltas.append(detok.step(ids[pos : pos + size]))
        pos += size
        sent += deltas[-1]
        # A partial character sent as U+FFFD and completed later would break this.
        assert expected.startswith(sent), (ids, pos, sent, expected)
        assert detok.text == sent
    deltas.append(detok.flush())
    assert "".join(deltas) == expected, (ids, deltas, expected)
    assert detok.text == expected
    assert detok.flush() == ""
    return deltas


@functools.cache
def word_piece() -> Tokenizer:
    """A WordPiece tokenizer (BERT's scheme), whose decoder puts a space between any two
    tokens but a word's "##" pieces: special [CLS] (1), [SEP] (2); words hello (3) and
    world (4), the piece ##s (5); <x> (6), added but not special."""
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "hello": 3, "world": 4, "##s": 5}
    backend = tokenizers.Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    backend.add_special_tokens(["[UNK]", "[CLS]", "[SEP]"])
    backend.add_tokens(["<x>"])
    return Tokenizer(PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]"))
