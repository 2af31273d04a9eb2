"""The plain data that crosses layers in a step.

The scheduler hands the model runner a ``SchedulerOutput``; the runner returns a
``ModelRunnerOutput`` that the scheduler applies to its sequences, and the scheduler
reports each sequence's progress to the front end as a ``SequenceUpdate``. None of
them holds a reference to a live Sequence: the runner never changes a request, and
nothing after the scheduler does either.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_infer.engine.params.image_input import ImageInput
from hetero_infer.engine.params.pooling_params import PoolingParams
from hetero_infer.engine.params.sampling_params import SamplingParams

# Per token: {token id: logprob} of the token itself, then of its top alternatives.
Logprobs = dict[int, float]


class RankedLogprobs(dict[int, float]):
    """A prompt token's Logprobs, with the token's rank in the vocabulary (1: the most
    likely), which vLLM's prompt_logprobs report and its alternatives alone cannot
    give (the token may not be among them)."""

    def __init__(self, logprobs: Logprobs, rank: int) -> None:
        super().__init__(logprobs)
        self.rank = rank


# A draft token the draft model has yet to propose: no vocabulary has it, so a slot the
# runner forgot to fill fails at the embedding instead of verifying a made-up token.
DRAFT_PLACEHOLDER = -1
# Async scheduling (core/pending_tokens.py): the token a sequence sampled in the step
# still running, which the runner, running steps in order, puts in its place.
PENDING_TOKEN = -2


@dataclass
class ScheduledSequence:
    """One sequence's share of a step: what the runner computes and samples for it.

    Nothing changes one once the scheduler has made it; it is not frozen because a step
    makes one per sequence (as SequenceUpdate), and a frozen dataclass pays a call per
    field."""

    request_id: str
    # The tokens whose KV this step computes (draft tokens last), and the position of
    # the first.
    token_ids: list[int]
    start: int
    # Its block table in each KV cache group (engine/models/kv_layout.py), by index.
    block_tables: list[list[int]]
    # Whether this step reaches the sequence's last token, so a token is sampled (never
    # for an embedding request).
    samples: bool
    sampling_params: SamplingParams
    # Speculative decoding: the guessed tokens at the end of token_ids, which the model
    # verifies in this step (engine/verifier.py). With a draft model the
    # scheduler only reserves their slots (DRAFT_PLACEHOLDER each) and the runner's
    # draft model fills them in before the target's pass.
    draft_token_ids: tuple[int, ...] = ()
    # With a draft model: None where the draft model does not run for this sequence this
    # step (a decode step without drafts); else the tokens before ``start`` whose KV the
    # draft model has not computed yet, which it computes first (empty when it is level
    # with the target).
    draft_lag_token_ids: tuple[int, ...] | None = None
    # What the sampler needs beyond the params (only where it applies):
    # tokens masked out because the sequence may not stop yet (min_tokens);
    banned_token_ids: frozenset[int] = frozenset()
    # the one token it must take (a spent thinking budget's end mark);
    forced_token_id: int | None = None
    # the prompt and output so far, for penalties;
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None
    # the tokens the JSON grammar allows next (llguidance's bit mask, 32 tokens a word).
    grammar_bitmask: bytes | None = None
    # Prompt logprobs: the prompt positions that have them already (None: not asked),
    # and the prompt they predict.
    num_prompt_logprobs: int | None = None
    # Embedding requests: how the prompt's final hidden states are pooled (None for
    # generation), and whether this step reaches the prompt's last token, so the pooled
    # vector is returned instead of a sampled token.
    pooling: PoolingParams | None = None
    returns_embedding: bool = False
    # LongRoPE: its tokens take the long factors (Sequence.long_rope).
    long_rope: bool = False
    # The slot of the LoRA adapter its rows take (0: none; engine/lora/).
    lora_slot: int = 0
    # The images with placeholder tokens among token_ids (params/image_input.py).
    images: tuple[ImageInput, ...] = ()

    @property
    def block_table(self) -> list[int]:
        """The first group's table: every computed token's block."""
        return self.block_tables[0]

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_draft_tokens(self) -> int:
        return len(self.draft_token_ids)

    @property
    def sample_position(self) -> int:
        """The position of the token this step samples (the first, with drafts)."""
        return self.start + self.num_new_tokens - self.num_draft_tokens


@dataclass
class BlockMoves:
    """The block copies of one KV cache group that the model runner does before a
    step's forward pass, in this order (a block swapped out may be handed to a swap-in
    or a copy in the same step)."""

    swap_out: list[tuple[int, int]] = field(default_factory=list)  # gpu -> cpu
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # cpu -> gpu
    copy: list[tuple[int, int]] = field(default_factory=list)  # gpu -> gpu

    def extend(self, other: BlockMoves) -> None:
        self.swap_out += other.swap_out
        self.swap_in += other.swap_in
        self.copy += other.copy


@dataclass
class TierMoves:
    """One KV cache group's traffic with the prefix cache's RAM and disk tiers
    (engine/kv/) this step, which the runner does in this order: ``save``, ``persist``
    and ``write`` read device blocks and host slots before anything writes into them
    (the files are written off the step, from copies), ``read`` stages files into host
    slots, and ``load`` (after the swap-outs, before swap-ins, copies and the forward
    pass) writes device blocks."""

    group: int
    save: list[tuple[int, int]] = field(default_factory=list)  # device block -> host slot
    # device block -> file: (block, block hash, the block's tokens) of blocks computed
    # into the prefix cache since the last step, so that a restart finds them.
    persist: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    # host slot -> file, and file -> host slot: (slot, block hash, the block's tokens)
    write: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    read: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    load: list[tuple[int, int]] = field(default_factory=list)  # host slot -> device block

    def __bool__(self) -> bool:
        return bool(self.save or self.persist or self.write or self.read or self.load)


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    # Block copies the model runner does before the forward pass, in this order, in the
    # first KV cache group (the only one of most models).
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # gpu -> cpu
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # cpu -> gpu
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # gpu -> gpu
    # The same in each later group (1, 2, ...: e.g. the sliding-window layers').
    later_group_moves: list[BlockMoves] = field(default_factory=list)
    # The prefix cache's tier traffic, per KV cache group that has any.
    tier_moves: list[TierMoves] = field(default_factory=list)
    # Ids of sequences preempted this step, and of those finished since the last step
    # (the runner drops what it keeps for them, e.g. their random generators).
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)

    def group_moves(self, group: int) -> BlockMoves:
        """The block copies in one KV cache group (none where the step has none there)."""
        if group == 0:
            return BlockMoves(self.blocks_to_swap_out, self.blocks_to_swap_in, self.blocks_to_copy)
        later = self.later_group_moves
        return later[group - 1] if group <= len(later) else BlockMoves()

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    # NaN unless the request asked for logprobs (they are computed only where asked).
    logprob: float
    # The token's and its top alternatives' logprobs, when the request asked.
    top_logprobs: Logprobs | None = None


@dataclass(frozen=True)
class ModelRunnerOutput:
    # Per sampling sequence, its new tokens in order: one, or with draft tokens, the
    # accepted drafts and then the model's own next token.
    sampled: dict[str, list[SampledToken]] = field(default_factory=dict)
    # Per sequence, for the prompt positions this step computed: each one's prediction
    # of the next prompt token (in order, continuing where the last step stopped).
    prompt_logprobs: dict[str, list[Logprobs]] = field(default_factory=dict)
    # Per embedding request whose prompt this step completed: its pooled, normalized
    # final hidden state.
    embeddings: dict[str, list[float]] = field(default_factory=dict)
    # The disk reads the scheduler asked for: (group, block hash, whether the file was
    # whole and ours), so that it knows which blocks its host slots now hold.
    tier_reads: tuple[tuple[int, int, bool], ...] = ()


EMPTY_RUNNER_OUTPUT = ModelRunnerOutput()


@dataclass
class SequenceUpdate:
    """What one step did to a sequence, for the front end to turn into an output."""

    request_id: str
    # The tokens it got (several where draft tokens were accepted; none for a prompt
    # chunk).
    new_tokens: list[SampledToken]
    new_prompt_logprobs: list[Logprobs]
    # "stop", "length", "abort", "error" once finished; None while it runs.
    finish_reason: str | None
    # The stop_token_ids entry that ended it (vLLM's stop_reason).
    stop_reason: int | None
    num_output_tokens: int
    num_preemptions: int
    first_scheduled_time: float | None
    finished_time: float | None
    # An embedding request's pooled vector, on the update that finishes it.
    embedding: list[float] | None = None
    # The tokens the prefix cache gave it when first scheduled (0 until then).
    num_cached_tokens: int = 0
