"""Plain-data records of a live Sequence for one step (the types in step_data.py):
what the model runner gets of it, and what the front end gets back.
"""

from __future__ import annotations

from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.core.step_data import SampledToken, ScheduledSequence, SequenceUpdate
from hetero_infer.engine.core.stop import banned_token_ids


def schedule_entry(
    seq: Sequence,
    num_new: int,
    draft_token_ids: list[int] | None = None,
    draft_model: bool = False,
) -> ScheduledSequence:
    """The plain-data copy of what the runner needs of ``seq`` for this step: its next
    ``num_new`` tokens, then the draft tokens the step verifies. ``draft_model``: the
    runner has a draft model, which runs for this sequence where it drafts or computes
    more than its newest token (a prompt chunk), catching up on the tokens it lags by."""
    start = seq.num_computed_tokens
    params = seq.sampling_params
    reaches_end = start + num_new == len(seq.token_ids)
    samples = reaches_end and seq.pooling is None
    entry = ScheduledSequence(
        request_id=seq.request_id,
        token_ids=seq.token_ids[start : start + num_new],
        start=start,
        # Copies: the runner may still read them while the next step's are changed.
        block_tables=[table.copy() for table in seq.block_tables],
        samples=samples,
        sampling_params=params,
        num_prompt_logprobs=seq.num_prompt_logprobs,
        pooling=seq.pooling,
        returns_embedding=reaches_end and seq.pooling is not None,
        long_rope=seq.long_rope,
        lora_slot=seq.lora_slot,
    )
    if (
        seq.plain
        and not draft_token_ids
        and not draft_model
        and params.allows_stop(seq.num_output_tokens)
    ):
        return entry  # nothing more to ask (most steps of most sequences)
    if draft_token_ids:
        entry.draft_token_ids = tuple(draft_token_ids)
        entry.token_ids += entry.draft_token_ids
    if draft_model and seq.pooling is None:
        # A decode step without drafts leaves the draft model behind by a token: running
        # it in every step would cost a draft pass even where nothing is drafted.
        lone_decode = num_new == 1 and reaches_end and seq.num_output_tokens > 0
        if draft_token_ids or not lone_decode:
            entry.draft_lag_token_ids = tuple(seq.token_ids[seq.num_draft_computed_tokens : start])
    if seq.images:
        entry.images = seq.images_for_chunk(start, start + num_new)
    if samples:
        entry.banned_token_ids = banned_token_ids(seq)
        if params.thinking_budget is not None:
            entry.forced_token_id = params.thinking_budget.forced_token(seq.token_ids)
        if seq.grammar is not None:
            entry.grammar_bitmask = seq.grammar.compute_bitmask()
    if params.has_penalties or seq.needs_prompt_logprobs:
        entry.prompt_token_ids = seq.prompt_token_ids
    if params.has_penalties:
        entry.output_token_ids = seq.output_token_ids
    return entry


def sequence_update(
    seq: Sequence,
    new_tokens: list[SampledToken],
    prompt_logprobs: list,
    embedding: list[float] | None = None,
) -> SequenceUpdate:
    """The plain-data report of ``seq``'s progress in a step, for the front end."""
    return SequenceUpdate(
        request_id=seq.request_id,
        new_tokens=new_tokens,
        new_prompt_logprobs=prompt_logprobs,
        finish_reason=seq.status.finish_reason,
        stop_reason=seq.stop_reason,
        num_output_tokens=seq.num_output_tokens - seq.num_pending_tokens,
        num_preemptions=seq.num_preemptions,
        first_scheduled_time=seq.first_scheduled_time,
        num_cached_tokens=seq.num_cached_tokens,
        finished_time=seq.finished_time,
        embedding=embedding,
    )
