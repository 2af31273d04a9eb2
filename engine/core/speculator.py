"""Speculator: which decoding sequences get draft tokens this step, and how many.

The scheduler asks it for each sequence it schedules for a decode; the drafts ride in
that step as extra query tokens with KV slots of their own, and the scheduler reports
back how many the model accepted. Pure Python, like the scheduler: n-gram drafts are
found here; a draft model's are proposed by the model runner, so here they are only
placeholders that reserve the step's slots and budget.

A sequence is only drafted for where the verifier reproduces what plain decoding
would give, token for token or in distribution (NOT_SPECULATED says where it is not).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.draft_length import DraftLength
from hetero_infer.engine.core.ngram_proposer import NgramProposer, TokenText
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.core.spec_decode_stats import SpecDecodeStats
from hetero_infer.engine.core.step_data import DRAFT_PLACEHOLDER, ScheduledSequence, SchedulerOutput
from hetero_infer.engine.settings.speculative_config import SpeculativeConfig

# Said at start-up: the requests (or steps) that decode one token at a time.
NOT_SPECULATED = (
    "requests with a JSON schema (response_format, tool calls): the grammar takes one "
    "token at a time; steps before a request's min_tokens is reached (eos and stop "
    "tokens are masked there); a request's first token (its prompt's step)"
)


@dataclass
class DraftState:
    """What the speculator keeps per sequence (on the Sequence, so it ends with it)."""

    text: TokenText = field(default_factory=TokenText)
    length: DraftLength | None = None


class Speculator:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.uses_draft_model = config.uses_draft_model
        self.proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        # The engine's counters of verified drafts (its metrics' spec_decode).
        self.stats = SpecDecodeStats(num_speculative_tokens=config.num_speculative_tokens)

    def draft(self, seq: Sequence, budget: int, max_model_len: int) -> list[int]:
        """Draft tokens for ``seq``'s decode step: at most ``budget`` (the step's token
        budget left after its own token), never so many that the step could give it
        more tokens than max_tokens or max_model_len allow. [] when it is not drafted
        for."""
        if not self.may_draft(seq):
            return []
        params = seq.sampling_params
        # The step gives back up to one token more than it drafts.
        room = min(
            budget,
            params.max_tokens - seq.num_output_tokens - 1,
            max_model_len - seq.num_tokens - 1,
        )
        if room <= 0:
            return []
        state = self._state(seq)
        want = min(room, state.length.next())
        if want <= 0:
            return []
        if self.uses_draft_model:
            return [DRAFT_PLACEHOLDER] * want
        return self.proposer.propose(state.text.sync(seq.token_ids), want)

    def schedule_drafts(
        self,
        steps: list[tuple[Sequence, int]],
        budget: int,
        num_running: int,
        block_manager: BlockManager,
        out: SchedulerOutput,
        max_model_len: int,
    ) -> dict[str, list[int]]:
        """Draft tokens for a step's decoding sequences (``steps``: each scheduled
        sequence and the tokens it computes), by request id. They come from what the
        step has left once everything else is scheduled: they ride in their sequence's
        step as extra query tokens, within the ``budget`` left, in free blocks only, so
        they never displace another sequence's tokens nor preempt anyone."""
        drafts: dict[str, list[int]] = {}
        if not self.drafts_at(num_running):
            return drafts
        for seq, num_new in steps:
            if budget <= 0:
                break
            found = self.draft(seq, budget, max_model_len)
            while found and not block_manager.can_allocate_slots(seq, num_new + len(found)):
                found.pop()
            if found:
                # Its own token's slot (and copy-on-write) is taken: this only grows it.
                out.blocks_to_copy.extend(block_manager.allocate_slots(seq, num_new + len(found)))
                drafts[seq.request_id] = found
                budget -= len(found)
        return drafts

    def drafts_at(self, batch_size: int) -> bool:
        """Whether a step with ``batch_size`` running requests drafts at all."""
        limit = self.config.disable_by_batch_size
        return limit is None or batch_size <= limit

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """How many of the drafts the model accepted (before any stop cut them): the
        sequence's draft length backs off or grows by it, and the counters take it."""
        self._state(seq).length.record(num_drafted, num_accepted)
        self.stats.record(num_drafted, num_accepted)

    @staticmethod
    def may_draft(seq: Sequence) -> bool:
        """A decode step (only the newest token is uncomputed) of a sequence whose
        sampling the verifier reproduces exactly: not where a step's masks depend on
        the tokens before it (a grammar, a bad word of several tokens, a thinking
        budget), which the verifier's rows share."""
        params = seq.sampling_params
        return (
            seq.num_uncomputed_tokens == 1
            and seq.num_output_tokens > 0
            and seq.grammar is None
            and seq.pooling is None
            and params.allows_stop(seq.num_output_tokens)
            and params.thinking_budget is None
            and all(len(word) == 1 for word in params.bad_words_token_ids)
        )

    def _state(self, seq: Sequence) -> DraftState:
        if seq.draft_state is None:
            seq.draft_state = DraftState(length=DraftLength(self.config.num_speculative_tokens))
        return seq.draft_state


def advance_draft_kv(seq: Sequence, item: ScheduledSequence) -> int:
    """With a draft model: how far the draft model's KV reaches after this step (it ran
    on the step's own tokens and on every draft but the last, whose KV is never needed
    unless all are accepted); the tokens whose blocks may enter the prefix cache."""
    if item.draft_lag_token_ids is not None:
        reached = item.start + item.num_new_tokens - (1 if item.num_draft_tokens else 0)
        seq.num_draft_computed_tokens = min(reached, seq.num_computed_tokens)
    return seq.num_draft_computed_tokens
