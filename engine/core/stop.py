"""check_stop: the one place that decides whether a new token ends its sequence.

Stop strings need text, so the front end finds them and has the scheduler finish the
sequence (as an abort with reason "stop"); everything decided by tokens is here.
"""

from __future__ import annotations

import logging

from hetero_infer.engine.core.sequence import Sequence, SequenceStatus
from hetero_infer.engine.core.step_data import SampledToken

logger = logging.getLogger(__name__)


def check_stop(seq: Sequence, max_model_len: int) -> SequenceStatus | None:
    """The status that the sequence's newest token ends it with, or None; sets
    ``seq.stop_reason`` for a stop_token_ids entry. The grammar (response_format) is fed
    the token here too: where the JSON is complete, the sequence stops."""
    params = seq.sampling_params
    token_ids = seq.token_ids  # (counted here, not through Sequence's properties: per token)
    token_id = token_ids[-1]
    num_output_tokens = len(token_ids) - seq.num_prompt_tokens
    may_stop = params.allows_stop(num_output_tokens)
    status = None
    if may_stop and not params.ignore_eos and token_id in seq.eos_token_ids:
        status = SequenceStatus.FINISHED_STOPPED
    elif may_stop and token_id in params.stop_token_set:
        status = SequenceStatus.FINISHED_STOPPED
        seq.stop_reason = token_id
    elif num_output_tokens >= params.max_tokens or len(token_ids) >= max_model_len:
        status = SequenceStatus.FINISHED_LENGTH
    if seq.grammar is None:
        return status
    if not seq.grammar.consume_token(token_id):
        # A constraint can fail past its first tokens (llguidance's limits: a parser row
        # of more than 2,000 items, a loop below a schema's root): the request ends
        # with an error, which each route reports in its own terms.
        logger.warning("the request's constraint failed: %s", seq.grammar.get_error())
        return status or SequenceStatus.FINISHED_FAILED
    if status is None and seq.grammar.is_stopped():
        return SequenceStatus.FINISHED_STOPPED
    return status


def append_until_stop(
    seq: Sequence, sampled: list[SampledToken], max_model_len: int
) -> tuple[list[SampledToken], SequenceStatus | None]:
    """Append a step's tokens one by one, up to the first that ends the sequence (a stop
    token, eos, max_tokens...): the tokens kept, and the status that ends it, if any."""
    for i, token in enumerate(sampled):
        seq.token_ids.append(token.token_id)
        status = check_stop(seq, max_model_len)
        if status is not None:
            return sampled[: i + 1], status
    return sampled, None


def banned_token_ids(seq: Sequence) -> frozenset[int]:
    """Tokens the sampler masks out: those that would stop the sequence before
    min_tokens, and those that would complete one of its bad words."""
    params = seq.sampling_params
    banned: frozenset[int] = frozenset()
    if not params.allows_stop(seq.num_output_tokens):
        banned = params.stop_token_set if params.ignore_eos else seq.stop_and_eos_token_ids
    if params.bad_words_token_ids:
        banned = banned | bad_word_endings(seq, params.bad_words_token_ids)
    return banned


def bad_word_endings(seq: Sequence, words: list[list[int]]) -> frozenset[int]:
    """The last token of each bad word whose other tokens end the output so far."""
    endings = set()
    for word in words:
        before = len(word) - 1
        if before == 0:
            endings.add(word[0])
        elif seq.num_output_tokens >= before and seq.token_ids[-before:] == word[:-1]:
            endings.add(word[-1])
    return frozenset(endings)
