"""engine/tokenizer/byte_level_detokenizer.py: byte-level BPE's stream by bytes, against
the Rust decoder on SmolLM2's tokenizer (the contract of IncrementalDetokenizer: the
text sent is always a prefix of the decode, and adds up to it; random ids against both
detokenizers: test_detokenizer.py)."""

from __future__ import annotations

import pytest
from hetero_infer.engine.tokenizer import IncrementalDetokenizer, Tokenizer, new_detokenizer
from hetero_infer.engine.tokenizer.byte_level_detokenizer import ByteLevelDetokenizer

from tests.engine.tokenizer.common import MIXED_TEXT, stream_deltas

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
