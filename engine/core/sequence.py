"""Sequence: one request's (or one choice's) tokens, KV blocks and place in the state
machine, as the scheduler keeps it.

waiting -> running (prefill, possibly in chunks, then decode) -> finished
(stopped, length, aborted, failed); running -> waiting on recompute preemption,
running -> swapped -> running on swap preemption; waiting -> rejected when it waited
longer than max_queue_time before it was first scheduled.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import time
from typing import TYPE_CHECKING, Any

from hetero_infer.engine.params.image_input import ImageInput
from hetero_infer.engine.params.pooling_params import PoolingParams
from hetero_infer.engine.params.sampling_params import SamplingParams

if TYPE_CHECKING:
    from hetero_infer.engine.lora.registry import LoRARequest

# The first block's parent hash for a sequence whose KV is rotated with LongRoPE's long
# factors (Sequence.long_rope), so its blocks never serve one rotated the short way.
LONG_ROPE_SALT = 1


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_FAILED = "error"
    # Refused before it started (max_queue_time): the server answers 503, not a choice.
    FINISHED_REJECTED = "rejected"

    # A dict's lookup, not the member's name and value: an Enum's are found through a
    # descriptor, and the engine asks these of every sequence at every step.
    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's finish_reason for a finished status ("stop", "length", "abort", "error"),
        or "rejected", which the server turns into a 503."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {s: s.value for s in SequenceStatus if s.name.startswith("FINISHED")}


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: frozenset[int] = frozenset(),
        grammar: Any = None,
        pooling: PoolingParams | None = None,
        priority: int = 0,
        deadline: float | None = None,
        lora: LoRARequest | None = None,
        images: tuple[ImageInput, ...] = (),
    ) -> None:
        """``lora``: the LoRA adapter it runs with (its name, the slot its rows take,
        its fingerprint; engine/lora/registry.py). ``images``: the prompt's images, whose
        embeddings the runner puts at their tokens."""
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.images = images
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        # response_format: an llguidance matcher, fed every output token; its end is a stop.
        self.grammar = grammar
        # An embedding request: how the prompt's final hidden states are pooled (they end
        # it after the prefill; None: a generation request).
        self.pooling = pooling
        # n > 1: the other choices of the request, forked from this one's KV blocks once
        # its prompt is computed (see Scheduler.update_from_output).
        self.fork_children: list[Sequence] = []
        self.status = SequenceStatus.WAITING
        # Tokens whose KV is in the cache (or is being written this step).
        self.num_computed_tokens = 0
        # Async scheduling: PENDING_TOKENs at the end of token_ids, the tokens that
        # steps handed to the runner sample for it (core/pending_tokens.py).
        self.num_pending_tokens = 0
        # Speculative decoding with a draft model: the first tokens whose KV the draft
        # model has in its own cache (at most num_computed_tokens; it lags behind where
        # decode steps went without drafts, and catches up when it next drafts).
        self.num_draft_computed_tokens = 0
        # Physical KV block ids, in logical order (GPU blocks, or CPU blocks while
        # swapped), per KV cache group by index (core/kv_cache_group.py; a group adds
        # its table when it first gives the sequence blocks).
        self.block_tables: list[list[int]] = [[]]
        # Prefix-cache bookkeeping: chained hashes of full token blocks, and how
        # many of this sequence's blocks are registered in the cache.
        self.block_hashes: list[int] = []
        self.num_registered_blocks = 0
        # Prompt positions whose logprobs are computed (None: not asked). The first prompt
        # token has none (nothing predicts it), so this starts at 1.
        self.num_prompt_logprobs: int | None = (
            1 if sampling_params.prompt_logprobs is not None else None
        )
        # A plain generation asks the runner for nothing but its tokens' KV and samples
        # (once past min_tokens): no grammar, penalties, bad words, thinking budget,
        # prompt logprobs, images or pooling (step_records.schedule_entry's short way).
        self.plain = (
            grammar is None
            and pooling is None
            and not images
            and self.num_prompt_logprobs is None
            and not sampling_params.has_penalties
            and not sampling_params.bad_words_token_ids
            and sampling_params.thinking_budget is None
        )
        self.num_preemptions = 0
        # LongRoPE: whether its KV is rotated with the long factors (its tokens had passed
        # the model's original context when it started computing them). It salts the
        # block hashes: the same tokens rotated the other way are different KV.
        self.long_rope = False
        self.lora = lora
        # Speculative decoding's per-sequence state (engine/speculator.py's
        # DraftState: its token text and draft length); None until it first drafts.
        self.draft_state: Any = None
        # What stopped it, as vLLM reports: a stop_token_ids entry (None for eos, length,
        # or while running; a stop string is found by the front end).
        self.stop_reason: int | None = None
        self.arrival_time = time.monotonic()
        # The priority policy schedules lower values first (ties by arrival_time).
        self.priority = priority
        # time.monotonic() past which the request is ended (its time limit); None: none.
        self.deadline = deadline
        self.first_scheduled_time: float | None = None
        self.finished_time: float | None = None
        # The tokens the prefix cache gave it when it was first scheduled (vLLM's
        # num_cached_tokens).
        self.num_cached_tokens = 0

    def start(self) -> None:
        """It is scheduled: the first time (not after a preemption), when, and how many
        of its tokens the prefix cache gave it."""
        if self.first_scheduled_time is None:
            self.first_scheduled_time = time.monotonic()
            self.num_cached_tokens = self.num_computed_tokens

    @functools.cached_property
    def stop_and_eos_token_ids(self) -> frozenset[int]:
        """The tokens masked out until min_tokens (with eos): made once, not per step."""
        return self.sampling_params.stop_token_set | self.eos_token_ids

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={len(self.token_ids)}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )

    @property
    def lora_slot(self) -> int:
        """The slot its LoRA adapter's rows take; 0: none."""
        return 0 if self.lora is None else self.lora.slot

    @property
    def lora_fingerprint(self) -> int | None:
        return None if self.lora is None else self.lora.fingerprint

    @property
    def lora_name(self) -> str | None:
        return None if self.lora is None else self.lora.name

    @property
    def hash_salt(self) -> int | None:
        """Its first block's parent hash in the prefix cache: set where the same tokens
        make other KV (LongRoPE's long factors; a LoRA adapter, by its fingerprint, which
        is even), so that the cache never serves one's blocks to the other; and where a
        request's cache_salt keeps its blocks to requests of the same salt."""
        if self.lora_fingerprint is None:
            salt = LONG_ROPE_SALT if self.long_rope else None
        else:
            salt = self.lora_fingerprint | self.long_rope
        cache_salt = self.sampling_params.cache_salt
        if cache_salt is None:
            return salt
        data = cache_salt.encode() + (salt or 0).to_bytes(8, "little")
        return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")

    def images_in(self, start: int, end: int) -> tuple[ImageInput, ...]:
        """The images with placeholder tokens in positions [start, end)."""
        return tuple(image for image in self.images if image.overlaps(start, end))

    def images_for_chunk(self, start: int, end: int) -> tuple[ImageInput, ...]:
        """The images a chunk of positions [start, end) needs: those with tokens in it,
        and with M-RoPE those before it too, which move its positions."""
        if self.images and self.images[0].grid is not None:
            return self.images_in(0, end)
        return self.images_in(start, end)

    @property
    def block_table(self) -> list[int]:
        """The first KV cache group's table: every computed token's block."""
        return self.block_tables[0]

    @block_table.setter
    def block_table(self, table: list[int]) -> None:
        self.block_tables[0] = table

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def chunk_tokens(self, budget: int) -> int:
        """The tokens a step computes for it within ``budget``: all it can, but never
        ending inside an image whose tokens attend both ways (ImageInput.bidirectional),
        which stops the chunk before it or, from inside it, waits (0) for a budget that
        reaches its end. None (0) after its last token, still pending."""
        if self.num_pending_tokens and self.num_output_tokens >= self.sampling_params.max_tokens:
            return 0  # its last token is pending (async scheduling): nothing after it
        start = self.num_computed_tokens
        num = min(self.num_tokens - start, budget)
        for image in self.images:
            if image.bidirectional and image.start < start + num < image.end:
                return max(image.start - start, 0)
        return num

    @property
    def needs_every_prompt_position(self) -> bool:
        """Whether every prompt position must run through the model here, none taken
        from the prefix cache: prompt logprobs still to compute, or mean pooling (the
        cache holds KV, not the hidden states the mean needs)."""
        mean_pooling = self.pooling is not None and self.pooling.kind == "mean"
        return self.needs_prompt_logprobs or mean_pooling

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Whether prompt logprobs are asked and not all computed yet."""
        return self.num_prompt_logprobs is not None and (
            self.num_prompt_logprobs < self.num_prompt_tokens
        )
