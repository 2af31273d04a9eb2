"""schedule_entry: what a step asks of the runner for a sequence. A plain generation's
entry holds its tokens and blocks alone; each feature that asks more fills its field."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.core.step_data import ScheduledSequence
from hetero_infer.engine.core.step_records import schedule_entry
from hetero_infer.engine.params.sampling_params import SamplingParams

PROMPT = [3, 4, 5]
OUTPUT = [6, 7]
EOS = 0


def decoding(params: SamplingParams, grammar: object = None) -> Sequence:
    """A sequence two tokens into its output, its newest token to compute."""
    seq = Sequence("s", PROMPT, params, eos_token_ids=frozenset({EOS}), grammar=grammar)
    seq.token_ids += OUTPUT
    seq.num_computed_tokens = seq.num_tokens - 1
    seq.block_tables = [[1, 2]]
    return seq


def extras(entry: ScheduledSequence) -> dict[str, object]:
    """The entry's fields that differ from a bare entry's defaults."""
    return {
        f.name: getattr(entry, f.name)
        for f in fields(ScheduledSequence)
        if f.default is not MISSING and getattr(entry, f.name) != f.default
    }


def test_a_plain_generation_asks_for_its_token_and_blocks_alone() -> None:
    seq = decoding(SamplingParams(temperature=0.7, top_p=0.9, seed=1, max_tokens=8))
    assert seq.plain
    entry = schedule_entry(seq, 1)
    assert (entry.token_ids, entry.start, entry.samples) == ([7], 4, True)
    assert entry.block_tables == [[1, 2]] and entry.block_tables[0] is not seq.block_tables[0]
    assert extras(entry) == {}


class Grammar:
    def compute_bitmask(self) -> bytes:
        return b"mask"


@pytest.mark.parametrize(
    ("params", "grammar", "expected"),
    [
        # Before min_tokens, eos is masked out: the sequence is plain, its step is not.
        (SamplingParams(min_tokens=4, max_tokens=8), None, {"banned_token_ids": {EOS}}),
        # A bad word's last token, where the output ends with the rest of it (the
        # prompt's tokens never count: [5, 6, 7, 2] bans nothing).
        (
            SamplingParams(bad_words_token_ids=[[9], [7, 8], [6, 7, 5], [4, 7, 1], [5, 6, 7, 2]]),
            None,
            {"banned_token_ids": {9, 8, 5}},
        ),
        (
            SamplingParams(repetition_penalty=1.2),
            None,
            {"prompt_token_ids": PROMPT, "output_token_ids": OUTPUT},
        ),
        (SamplingParams(), Grammar(), {"grammar_bitmask": b"mask"}),
    ],
)
def test_each_feature_that_asks_more_fills_its_field(params, grammar, expected) -> None:
    entry = schedule_entry(decoding(params, grammar), 1)
    assert extras(entry) == expected


def test_prompt_logprobs_still_to_compute_send_the_prompt() -> None:
    seq = Sequence("s", PROMPT, SamplingParams(prompt_logprobs=1))
    seq.block_tables = [[1]]
    assert not seq.plain
    entry = schedule_entry(seq, 2)  # a chunk of the prompt: nothing sampled yet
    assert (entry.token_ids, entry.samples) == ([3, 4], False)
    assert entry.prompt_token_ids == PROMPT


def test_draft_tokens_follow_the_sequences_own() -> None:
    entry = schedule_entry(decoding(SamplingParams()), 1, [8, 9])
    assert entry.token_ids == [7, 8, 9] and entry.draft_token_ids == (8, 9)
    assert entry.num_new_tokens == 3 and entry.num_draft_tokens == 2
