"""Async scheduling's bookkeeping on a Sequence: the tokens of a step still running.

With async scheduling (core/engine_core.py) the scheduler plans step N+1 while the
runner computes step N. Step N's sequences are advanced when it is handed over, as if
it had run: its tokens count as computed, and each sequence it samples for gets a
PENDING_TOKEN, the input of its next step, which the runner (running steps in order)
replaces with the token it sampled, and which step N's update replaces here.

A schedule that needs more than a sequence's length (a grammar's mask, penalties, bad
words or a thinking budget over its tokens, n > 1's forks after its prompt, how far its
prompt logprobs are) waits for the step in flight: ``needs_known_tokens``.
"""

from __future__ import annotations

from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.core.step_data import PENDING_TOKEN, ScheduledSequence


def hand_over(seq: Sequence, item: ScheduledSequence) -> None:
    """Advance ``seq`` by its share of a step handed to the runner, before it runs."""
    seq.num_computed_tokens += item.num_new_tokens
    if item.samples:
        seq.token_ids.append(PENDING_TOKEN)
        seq.num_pending_tokens += 1


def take_pending(seq: Sequence) -> int:
    """Remove the sequence's pending tokens, to append the first one's sampled token in
    its place; returns how many were left (those of the step after, still running),
    which ``put_back`` restores."""
    pending = seq.num_pending_tokens
    del seq.token_ids[len(seq.token_ids) - pending :]
    seq.num_pending_tokens = 0
    return pending - 1


def put_back(seq: Sequence, pending: int) -> None:
    seq.token_ids += [PENDING_TOKEN] * pending
    seq.num_pending_tokens = pending


def needs_known_tokens(seq: Sequence) -> bool:
    """Whether the sequence's next step needs the tokens of the step in flight."""
    params = seq.sampling_params
    return (
        seq.grammar is not None
        or params.has_penalties
        or params.thinking_budget is not None
        or bool(params.bad_words_token_ids)
        or bool(seq.fork_children)
        or seq.needs_prompt_logprobs
    )
