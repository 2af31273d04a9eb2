"""Verification: the sampler's rows for a step's drafted positions, and which drafts stand.

A sequence with d draft tokens computes d + 1 query positions in one step: its newest
token, then each draft. Position j's logits predict the token after draft j - 1, so
the sampler picks a token at each of the d + 1 positions, exactly as plain decoding
would pick it had drafts[:j] already been generated (``verification_rows`` makes row j
that step's entry: the same parameters, drafts[:j] in the output penalties see, and
the sample position j further on, which seeded requests draw their noise by). The
sequence keeps the picks while each equals the draft at its position, and the first
pick that differs (or, with every draft accepted, the pick after the last): 1 to d + 1
tokens.

Greedy, that is plain decoding token for token. Sampling, it is rejection sampling
with a deterministic proposer: the draft's distribution is a point mass on draft t,
so the usual rule (accept t with probability min(1, p(t) / 1) = p(t); on rejection
sample from p with t removed and renormalised) is the same as drawing x ~ p and
accepting iff x == t, keeping x when it differs. Each position draws its own noise,
so the tokens kept follow the target distribution exactly. Seeded requests draw a
position's noise from (seed, position) alone, so they give the same tokens with or
without drafts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hetero_infer.engine.core.step_data import ScheduledSequence


def verification_rows(item: ScheduledSequence) -> list[ScheduledSequence]:
    """The sampler's rows for one sampling sequence: itself, or one per drafted position."""
    drafts = item.draft_token_ids
    if not drafts:
        return [item]
    return [drafted_row(item, drafts[:j]) for j in range(len(drafts) + 1)]


def drafted_row(item: ScheduledSequence, drafts: Sequence[int]) -> ScheduledSequence:
    """The sampler's row for the position after ``drafts`` (the first drafts of
    ``item``): the step plain decoding would have had with them generated. A draft
    model proposes its tokens one row at a time with it."""
    num_own = item.num_new_tokens - item.num_draft_tokens
    output = item.output_token_ids
    return dataclasses.replace(
        item,
        token_ids=item.token_ids[:num_own] + list(drafts),
        draft_token_ids=(),
        draft_lag_token_ids=None,
        output_token_ids=None if output is None else output + list(drafts),
    )


def num_kept(drafts: Sequence[int], picks: Sequence[int]) -> int:
    """How many of a sequence's ``picks`` (one per row, len(drafts) + 1) it keeps: the
    picks that confirm drafts, then one more."""
    n = 0
    while n < len(drafts) and picks[n] == drafts[n]:
        n += 1
    return n + 1
