"""engine/tokenizer/detokenizer.py: IncrementalDetokenizer.

The detokenizer's contract is checked as properties: for any ids, fed in any chunks, the
text sent so far is always a prefix of the final decode (so no partial character is sent
as U+FFFD and later completed), and the deltas plus flush() add up to exactly that decode.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hetero_infer.engine.tokenizer import (
    INITIAL_CONTEXT_TOKENS,
    Detokenizer,
    IncrementalDetokenizer,
    Tokenizer,
    new_detokenizer,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerBase

from tests.engine.tokenizer.common import (
    MIXED_TEXT,
    PROPERTY_SETTINGS,
    SMOLLM2_VOCAB_SIZE,
    TEXT,
    byte_fallback,
    byte_tokens,
    stream_deltas,
)
from tests.helpers import BYTE_FALLBACK_VOCAB_SIZE, EOS_TOKEN_ID, make_byte_fallback_tokenizer

_CHUNK_SIZES = st.lists(st.integers(1, 5), min_size=1, max_size=5)


@st.composite
def _cut_characters(draw: st.DrawFn) -> bytes:
    """UTF-8 bytes of multi-byte characters, cut at arbitrary byte offsets."""
    data = draw(st.text(alphabet="é—中😀🎉👍🏽", min_size=1, max_size=3)).encode()
    start = draw(st.integers(0, len(data)))
    stop = draw(st.integers(start, len(data)))
    return data[start:stop]


_BYTE_FALLBACK_SEGMENT = st.one_of(
    st.lists(st.integers(0, BYTE_FALLBACK_VOCAB_SIZE - 1), max_size=6),  # specials too
    TEXT.map(lambda s: byte_fallback().encode(s, add_special_tokens=False)),
    _cut_characters().map(byte_tokens),
    st.binary(max_size=6).map(byte_tokens),  # mostly invalid UTF-8
)
_BYTE_FALLBACK_IDS = st.lists(_BYTE_FALLBACK_SEGMENT, max_size=8).map(
    lambda segments: list(itertools.chain.from_iterable(segments))
)


def _decode_after_prompt(
    tokenizer: Tokenizer, prompt: list[int], ids: list[int], skip_special_tokens: bool
) -> str:
    """decode(prompt + ids) minus decode(prompt): what a reader of both sees the ids add."""
    prompt_text = tokenizer.decode(prompt, skip_special_tokens)
    full = tokenizer.decode(prompt + ids, skip_special_tokens)
    assert full.startswith(prompt_text)
    return full[len(prompt_text) :]


class _DecodeRecorder(Tokenizer):
    """Records how many ids each decode call gets: the detokenizer's cost per step."""

    def __init__(self, hf_tokenizer: PreTrainedTokenizerBase) -> None:
        super().__init__(hf_tokenizer)
        self.decoded_lengths: list[int] = []

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.decoded_lengths.append(len(ids))
        return super().decode(ids, skip_special_tokens)


# ------------------------------------------------------- detokenizer: byte-fallback model


@PROPERTY_SETTINGS
@given(ids=_BYTE_FALLBACK_IDS, chunk_sizes=_CHUNK_SIZES, skip=st.booleans())
def test_detokenizer_matches_full_decode(
    bf_tok: Tokenizer, ids: list[int], chunk_sizes: list[int], skip: bool
) -> None:
    stream_deltas(bf_tok, [], ids, [1], skip, bf_tok.decode(ids, skip))
    stream_deltas(bf_tok, [], ids, chunk_sizes, skip, bf_tok.decode(ids, skip))


@PROPERTY_SETTINGS
@given(content=TEXT, ids=_BYTE_FALLBACK_IDS, chunk_sizes=_CHUNK_SIZES, skip=st.booleans())
def test_detokenizer_after_prompt_matches_full_decode_minus_prompt(
    bf_tok: Tokenizer, content: str, ids: list[int], chunk_sizes: list[int], skip: bool
) -> None:
    prompt = bf_tok.apply_chat_template([{"role": "user", "content": content}])
    expected = _decode_after_prompt(bf_tok, prompt, ids, skip)
    stream_deltas(bf_tok, prompt, ids, chunk_sizes, skip, expected)


def test_first_word_keeps_its_space_after_prompt(bf_tok: Tokenizer) -> None:
    ids = bf_tok.encode("Hello world", add_special_tokens=False)  # ▁Hello ▁world
    prompt = bf_tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert stream_deltas(bf_tok, prompt, ids, [1], True, " Hello world") == [" Hello", " world", ""]
    # Without a prompt the stream starts the text, and the decoder strips the space.
    assert stream_deltas(bf_tok, [], ids, [1], True, "Hello world") == ["Hello", " world", ""]


def test_byte_run_is_held_until_closed(bf_tok: Tokenizer) -> None:
    zhong = byte_tokens("中".encode())
    world = bf_tok.encode("world", add_special_tokens=False)  # ▁world
    assert stream_deltas(bf_tok, [], zhong + world, [1], True, "中 world") == [
        "",
        "",
        "",
        "中 world",
        "",
    ]
    # Why hold a valid run: one more invalid byte turns the whole run into U+FFFD per byte.
    invalid = zhong + byte_tokens(b"\xff")
    assert bf_tok.decode(invalid) == "\ufffd" * 4
    stream_deltas(bf_tok, [], invalid + world, [1], True, "\ufffd" * 4 + " world")
    # Skipped special tokens vanish before decoding, so they do not close a run.
    split = zhong[:2] + [EOS_TOKEN_ID] + zhong[2:]
    assert stream_deltas(bf_tok, [], split, [1], True, "中")[:-1] == ["", "", "", ""]
    stream_deltas(bf_tok, [], split, [1], False, "\ufffd\ufffd</s>\ufffd")


def test_truncated_character_is_flushed_as_replacement(bf_tok: Tokenizer) -> None:
    ids = bf_tok.encode("ok", add_special_tokens=False) + byte_tokens("😀".encode()[:3])
    assert stream_deltas(bf_tok, [], ids, [1], True, "ok" + "\ufffd" * 3)[-1] == "\ufffd" * 3


def test_prompt_ending_mid_character_decodes_output_alone(bf_tok: Tokenizer) -> None:
    # Never produced by encoding text: the output completes the prompt's half character.
    zhong = byte_tokens("中".encode())
    prompt = bf_tok.encode("a") + zhong[:1]
    ids = zhong[1:] + bf_tok.encode("b", add_special_tokens=False)
    stream_deltas(bf_tok, prompt, ids, [1], True, bf_tok.decode(ids))


def test_detokenizer_edge_calls(bf_tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(bf_tok, [])
    assert detok.step([]) == "" and detok.flush() == "" and detok.text == ""
    assert detok.step([EOS_TOKEN_ID]) == ""  # skipped special only
    assert detok.step(bf_tok.encode("Hello", add_special_tokens=False)) == "Hello"
    assert detok.flush() == "" and detok.text == "Hello"


def test_detokenizer_cost_per_step_is_bounded() -> None:
    tok = _DecodeRecorder(make_byte_fallback_tokenizer())
    ids = tok.encode(MIXED_TEXT * 40, add_special_tokens=False)
    assert len(ids) > 2000
    prompt = tok.encode("the prompt " * 100)
    expected = _decode_after_prompt(tok, prompt, ids, True)
    tok.decoded_lengths.clear()
    stream_deltas(tok, prompt, ids, [1], True, expected)
    # Window = prompt context + the longest byte run (the ZWJ family emoji, 18 bytes).
    assert max(tok.decoded_lengths) <= INITIAL_CONTEXT_TOKENS + 2 * 18
    # A byte run costs no decoding until a non-byte token closes it.
    detok = IncrementalDetokenizer(tok, prompt)
    tok.decoded_lengths.clear()
    for token_id in byte_tokens("😀".encode() * 200):
        assert detok.step([token_id]) == ""
    assert tok.decoded_lengths == []
    assert detok.flush() == "😀" * 200


# -------------------------------------------------------------------------- SmolLM2


@pytest.mark.slow
def test_smollm2_streams_real_text(smol_tok: Tokenizer) -> None:
    prompt = smol_tok.apply_chat_template([{"role": "user", "content": "Write emoji."}])
    ids = smol_tok.encode(MIXED_TEXT, add_special_tokens=False)
    deltas = stream_deltas(smol_tok, prompt, ids, [1], True, MIXED_TEXT)
    assert "\ufffd" not in "".join(deltas)
    assert " 😀" in deltas and "🎉" in deltas  # each sent whole, once its last byte arrived
    eos = sorted(smol_tok.eos_token_ids)
    stream_deltas(smol_tok, prompt, ids + eos, [1], True, MIXED_TEXT)
    stream_deltas(smol_tok, prompt, ids + eos, [3], False, MIXED_TEXT + "<|im_end|>")


@pytest.mark.slow
def test_smollm2_window_stays_short_on_invalid_bytes(smol_tok: Tokenizer) -> None:
    # A random model can repeat a token that ends in a partial character forever; the
    # held text must still go out, and each step must decode only a short window.
    partial = smol_tok.encode(" 😀", add_special_tokens=False)[0]
    assert smol_tok.decode([partial]).endswith("\ufffd")
    tok = _DecodeRecorder(smol_tok.hf_tokenizer)
    ids = [partial] * 500
    expected = tok.decode(ids)
    tok.decoded_lengths.clear()
    deltas = stream_deltas(tok, [], ids, [1], True, expected)
    assert sum(1 for d in deltas if d) > 100
    assert max(tok.decoded_lengths) <= 2 * INITIAL_CONTEXT_TOKENS + 4


@pytest.mark.slow
@pytest.mark.parametrize("make", [IncrementalDetokenizer, new_detokenizer], ids=["window", "bytes"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segments=st.lists(
        st.one_of(
            st.lists(st.integers(0, SMOLLM2_VOCAB_SIZE - 1), max_size=6).map(lambda x: ("ids", x)),
            st.tuples(st.just("text"), TEXT, st.integers(0, 8), st.integers(0, 8)),
        ),
        max_size=6,
    ),
    chunk_sizes=_CHUNK_SIZES,
    skip=st.booleans(),
)
def test_smollm2_random_ids_match_full_decode(
    smol_tok: Tokenizer,
    make: Callable[[Tokenizer, list[int], bool], Detokenizer],
    segments: list[tuple],
    chunk_sizes: list[int],
    skip: bool,
) -> None:
    """Both detokenizers (the engine streams SmolLM2 by bytes: new_detokenizer)."""
    ids: list[int] = []
    for segment in segments:
        if segment[0] == "ids":
            ids += segment[1]
        else:  # text cut at token offsets: pieces of multi-byte characters
            _, text, start, drop = segment
            encoded = smol_tok.encode(text, add_special_tokens=False)
            ids += encoded[start : max(start, len(encoded) - drop)]
    prompt = smol_tok.apply_chat_template([{"role": "user", "content": "hi"}])
    expected = smol_tok.decode(ids, skip)
    stream_deltas(smol_tok, [], ids, [1], skip, expected, make)
    stream_deltas(smol_tok, prompt, ids, chunk_sizes, skip, expected, make)
