"""vLLM's spaces_between_special_tokens=False: an added token right after another is
written as its text alone; the text of every other token is the decoder's."""

from __future__ import annotations

import pytest
from hetero_infer.engine.tokenizer import Tokenizer, new_detokenizer

from tests.engine.tokenizer.common import word_piece

CLS, SEP, HELLO, WORLD, PIECE_S, ADDED = 1, 2, 3, 4, 5, 6
IDS = [CLS, SEP, HELLO, SEP, ADDED, ADDED, WORLD, PIECE_S, SEP]


def streamed(tokenizer: Tokenizer, ids: list[int], chunk: int, **flags: bool) -> str:
    detokenizer = new_detokenizer(tokenizer, [HELLO], **flags)
    deltas = [detokenizer.step(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    text = "".join(deltas) + detokenizer.flush()
    assert detokenizer.text == text
    return text


@pytest.mark.parametrize("chunk", [1, 2, 4, len(IDS)])
def test_added_tokens_in_a_row_are_written_without_the_decoders_space(chunk: int) -> None:
    tokenizer = word_piece()
    assert tokenizer.decode(IDS, skip_special_tokens=False) == (
        "[CLS] [SEP] hello [SEP] <x> <x> worlds [SEP]"
    )
    flags = {"skip_special_tokens": False}
    # the decoder's text after the prompt's "hello", as every stream sends it
    spaced = " [CLS] [SEP] hello [SEP] <x> <x> worlds [SEP]"
    assert streamed(tokenizer, IDS, chunk, **flags) == spaced
    # a token after a word keeps its space; an added one after an added one has none
    written = " [CLS][SEP] hello [SEP]<x><x> worlds [SEP]"
    assert streamed(tokenizer, IDS, chunk, **flags, spaces_between_special_tokens=False) == written


def test_skipped_special_tokens_leave_the_flag_nothing_to_do() -> None:
    """As in vLLM, the flag reads only text that keeps special tokens; added tokens that
    are not special (<x>) are never skipped, and keep the decoder's spaces then."""
    tokenizer = word_piece()
    plain = streamed(tokenizer, IDS, 1)
    assert plain == " hello <x> <x> worlds"
    assert streamed(tokenizer, IDS, 1, spaces_between_special_tokens=False) == plain


def test_a_byte_level_tokenizers_added_tokens_decode_as_written(smol_tok: Tokenizer) -> None:
    """Byte-level BPE puts no space between tokens: there the flag changes nothing."""
    ids = smol_tok.encode("<|im_start|><|im_end|><|im_start|>user\nhi<|im_end|>")
    assert len(ids) == 7
    as_written = streamed(smol_tok, ids, 1, skip_special_tokens=False)
    flags = {"skip_special_tokens": False, "spaces_between_special_tokens": False}
    assert streamed(smol_tok, ids, 1, **flags) == as_written
    assert as_written == smol_tok.decode(ids, skip_special_tokens=False)
