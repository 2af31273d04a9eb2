"""LogprobsFormatter on a byte-fallback tokenizer: how a token shows in OpenAI's shapes
(a piece of a character as "bytes:\\xNN", special tokens by name), where text_offset
stands, and what stands in for logprobs JSON cannot carry."""

from __future__ import annotations

import math

import pytest
from hetero_infer.engine.core.step_data import RankedLogprobs
from hetero_infer.server.serving.logprobs import MIN_LOGPROB, LogprobsFormatter

from tests.engine.tokenizer.common import byte_fallback, byte_tokens
from tests.helpers import EOS_TOKEN, EOS_TOKEN_ID

EURO = byte_tokens("€".encode())  # e2 82 ac: a lead byte, two continuations


@pytest.fixture(scope="module")
def formatter() -> LogprobsFormatter:
    return LogprobsFormatter(byte_fallback())


@pytest.mark.parametrize(
    ("byte", "shown", "width"),
    [
        (0x41, "A", 1),  # a character alone: its text
        (0x7F, "\x7f", 1),
        (0x80, "bytes:\\x80", 0),  # the first continuation byte
        (0xBF, "bytes:\\xbf", 0),  # the last
        (0xC0, "bytes:\\xc0", 1),  # from here, lead bytes: the character counts there
        (0xE2, "bytes:\\xe2", 1),
    ],
)
def test_byte_tokens_show_as_openai_writes_them(formatter, byte, shown, width):
    (token_id,) = byte_tokens(bytes([byte]))
    assert formatter.token(token_id) == (shown, [byte])
    assert formatter.width(token_id) == width


def test_text_offset_counts_a_character_of_byte_tokens_once(formatter):
    tokens = byte_tokens(b"a") + EURO + byte_tokens(b"b")
    body = formatter.completion(tokens, [{t: -1.0} for t in tokens], text_offset=5)
    assert body["tokens"] == ["a", "bytes:\\xe2", "bytes:\\x82", "bytes:\\xac", "b"]
    assert body["text_offset"] == [5, 6, 7, 7, 7]
    assert formatter.text_length(tokens) == len("a€b")


def test_special_tokens_show_by_name(formatter):
    assert formatter.token(EOS_TOKEN_ID)[0] == EOS_TOKEN
    entry = RankedLogprobs({EOS_TOKEN_ID: -0.5}, rank=1)
    assert formatter.prompt([None, entry])[1][str(EOS_TOKEN_ID)]["decoded_token"] == EOS_TOKEN


def test_logprobs_json_cannot_carry_show_as_the_floor(formatter):
    a, b, c = byte_tokens(b"abc")
    body = formatter.completion([a], [{a: math.nan, b: -math.inf, c: -20000.0}], 0)
    assert body["token_logprobs"] == [MIN_LOGPROB]
    assert body["top_logprobs"] == [{"a": MIN_LOGPROB, "b": MIN_LOGPROB, "c": MIN_LOGPROB}]


def test_completion_has_nothing_for_the_first_prompt_token(formatter):
    a, b = byte_tokens(b"ab")
    body = formatter.completion([a, b], [None, {b: -0.25, a: -2.0}], 0)
    assert body["token_logprobs"] == [None, -0.25]
    assert body["top_logprobs"] == [None, {"b": -0.25, "a": -2.0}]


def test_chat_keeps_the_best_alternatives_in_order(formatter):
    a, b, c, d = byte_tokens(b"abcd")
    body = formatter.chat([c], [{c: -3.0, a: -1.0, d: -0.5, b: -2.0}], top=2)
    (item,) = body["content"]
    assert (item["token"], item["logprob"], item["bytes"]) == ("c", -3.0, [ord("c")])
    assert [(t["token"], t["logprob"]) for t in item["top_logprobs"]] == [("d", -0.5), ("a", -1.0)]
    assert formatter.chat([a], [{a: -1.0}], top=0)["content"][0]["top_logprobs"] == []


def test_prompt_logprobs_rank_the_token_as_the_engine_did(formatter):
    a, b, c = byte_tokens(b"abc")
    # The prompt token first; its rank among the whole vocabulary is the engine's.
    entry = RankedLogprobs({a: -4.0, b: -0.1, c: -1.0}, rank=7)
    assert formatter.prompt([None, entry]) == [
        None,
        {
            str(a): {"logprob": -4.0, "rank": 7, "decoded_token": "a"},
            str(b): {"logprob": -0.1, "rank": 1, "decoded_token": "b"},
            str(c): {"logprob": -1.0, "rank": 2, "decoded_token": "c"},
        },
    ]


def test_tokens_as_ids_show_any_token_whole():
    formatter = LogprobsFormatter(byte_fallback(), as_token_ids=True)
    lead = EURO[0]
    assert formatter.shown(lead) == (f"token_id:{lead}", list(f"token_id:{lead}".encode()))
    assert formatter.completion([lead], [{lead: -1.0}], 0)["tokens"] == [f"token_id:{lead}"]
    entry = RankedLogprobs({lead: -1.0}, rank=1)
    assert formatter.prompt([entry])[0][str(lead)]["decoded_token"] == f"token_id:{lead}"
