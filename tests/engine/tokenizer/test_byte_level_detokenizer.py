"""engine/tokenizer/byte_level_detokenizer.py: byte-level BPE's stream by bytes, against
the Rust decoder on SmolLM2's tokenizer (the contract of IncrementalDetokenizer: the
text sent is always a prefix of the decode, and adds up to it)."""

from __future__ import annotations

import pytest
from hetero_infer.engine.tokenizer import IncrementalDetokenizer, Tokenizer, new_detokenizer
from hetero_infer.engine.tokenizer.byte_level_detokenizer import ByteLevelDetokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.tokenizer.common import MIXED_TEXT, SMOLLM2_VOCAB_SIZE, TEXT, stream_deltas

pytestmark = pytest.mark.slow  # SmolLM2's tokenizer, converted from the packaged GGUF


def test_the_engine_streams_smollm2_by_bytes_and_byte_fallback_by_windows(
    smol_tok: Tokenizer, bf_tok: Tokenizer
) -> None:
    assert isinstance(new_detokenizer(smol_tok, [1, 2]), ByteLevelDetokenizer)
    assert isinstance(new_detokenizer(bf_tok, [1, 2]), IncrementalDetokenizer)


def test_every_token_alone_decodes_as_the_rust_decoder_does(smol_tok: Tokenizer) -> None:
    bytes_of = smol_tok.byte_level_token_bytes
    for token_id in range(len(smol_tok.hf_tokenizer) + 2):  # two ids past the vocabulary
        expected = smol_tok.decode([token_id], skip_special_tokens=False)
        assert bytes_of(token_id).decode("utf-8", "replace") == expected, token_id


def test_a_character_goes_out_whole_once_its_last_byte_came(smol_tok: Tokenizer) -> None:
    prompt = smol_tok.apply_chat_template([{"role": "user", "content": "Write emoji."}])
    ids = smol_tok.encode(MIXED_TEXT, add_special_tokens=False)
    deltas = stream_deltas(smol_tok, prompt, ids, [1], True, MIXED_TEXT, new_detokenizer)
    assert "\ufffd" not in "".join(deltas)
    assert "😀" in deltas and "🎉" in deltas  # the space before went out at once
    eos = sorted(smol_tok.eos_token_ids)
    stream_deltas(
        smol_tok, prompt, ids + eos, [3], False, MIXED_TEXT + "<|im_end|>", new_detokenizer
    )


def test_bytes_that_never_complete_a_character_go_out_at_once(smol_tok: Tokenizer) -> None:
    # A random model can repeat a token that ends in a partial character forever.
    partial = smol_tok.encode(" 😀", add_special_tokens=False)[0]
    ids = [partial] * 50
    deltas = stream_deltas(smol_tok, [], ids, [1], True, smol_tok.decode(ids), new_detokenizer)
    assert sum(1 for d in deltas if d) >= 49


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segments=st.lists(
        st.one_of(
            st.lists(st.integers(0, SMOLLM2_VOCAB_SIZE - 1), max_size=6).map(lambda x: ("ids", x)),
            st.tuples(st.just("text"), TEXT, st.integers(0, 8), st.integers(0, 8)),
        ),
        max_size=6,
    ),
    chunk_sizes=st.lists(st.integers(1, 5), min_size=1, max_size=5),
    skip=st.booleans(),
)
def test_random_ids_stream_to_the_rust_decode(
    smol_tok: Tokenizer, segments: list[tuple], chunk_sizes: list[int], skip: bool
) -> None:
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
    stream_deltas(smol_tok, [], ids, [1], skip, expected, new_detokenizer)
    stream_deltas(smol_tok, prompt, ids, chunk_sizes, skip, expected, new_detokenizer)
