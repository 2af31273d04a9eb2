"""SamplingParams: how one request picks its tokens and when it stops."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hetero_infer.engine.params.guided_decoding import StructuredOutputsParams
from hetero_infer.engine.params.thinking_budget import ThinkingBudget
from hetero_infer.engine.settings.exceptions import ValidationError

if TYPE_CHECKING:
    import torch

# Below this a temperature means greedy: dividing logits by it would overflow.
GREEDY_EPSILON = 1e-5
# Stop strings are searched in every step's new text: bound the work a request can ask for.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
# Bad words are checked against the output at every step.
MAX_BAD_WORDS = 1024
# OpenAI's ranges.
MAX_PENALTY = 2.0
MAX_LOGIT_BIAS = 100.0
# vLLM's default max_logprobs; OpenAI allows 20 top_logprobs in chat, 5 in completions.
MAX_LOGPROBS = 20
MAX_N = 128
# Entries of logit_bias and of stop_token_ids. vLLM sets no bound, OpenAI takes 300
# logit_bias entries. Each entry names a vocabulary token (checked against the model's
# in check_vocab), so a vocabulary bounds what is useful; this bound, the largest
# vocabularies served (Gemma's 262,144), refuses a longer list before that check. It is
# cheap to take them all: the sampler reads a request's bias as tensors made once per
# request and stop ids as a set made once, so each step costs a copy, not Python work
# per entry; the request body limit (--max-body-bytes) bounds them too.
MAX_TOKEN_ID_ENTRIES = 262_144


class RequestOutputKind(enum.Enum):
    """Which outputs a request gets, and what each holds (vLLM's names)."""

    # After every step that adds a token: everything so far (the offline API's default).
    CUMULATIVE = 0
    # After every step that adds text or tokens: only what it added (token_ids, text
    # and logprobs are the step's; prompt logprobs come with the first). For streams.
    DELTA = 1
    # Once, when finished: everything. For answers sent whole.
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    max_tokens: int = 16
    # Choices per request: they share the prompt's KV blocks (fork + copy-on-write).
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) = all tokens
    min_p: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    # eos and stop_token_ids are masked out (and stop strings not looked for) until
    # this many tokens are out, as in vLLM.
    min_tokens: int = 0
    presence_penalty: float = 0.0  # OpenAI: subtract once from every token already generated
    frequency_penalty: float = 0.0  # OpenAI: subtract per occurrence in the output so far
    repetition_penalty: float = 1.0  # vLLM/CTRL: divide (or multiply) logits of seen tokens
    logit_bias: dict[int, float] = field(default_factory=dict)
    # vLLM's: the only tokens the output may hold; and words it may not (a word's
    # last token is excluded where the output so far ends with the rest of it; the
    # input processor tokenizes them into bad_words_token_ids, with and without a
    # leading space, as vLLM does).
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = field(default_factory=list)
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    # Per generated token: its logprob and this many top alternatives (0 = only its own).
    logprobs: int | None = None
    # Per prompt token (from the second on): the same, from the prefill's logits.
    prompt_logprobs: int | None = None
    # Constrain the output to JSON matching this schema ({"type": "object"}: any object).
    json_schema: dict[str, Any] | None = None
    # Or one of vLLM's structured outputs (a choice, a regex, a grammar, ...): at most
    # one of the two.
    structured_outputs: StructuredOutputsParams | None = None
    # False keeps special tokens in the text (a tool-call marker may be one); the eos
    # that ends the request is left out all the same.
    skip_special_tokens: bool = True
    # vLLM's: where special tokens are kept, false writes two added tokens in a row
    # without the space a decoder may put between them (WordPiece's).
    spaces_between_special_tokens: bool = True
    # What each output holds: everything so far, the step's delta (streams), or only
    # the final output (answers sent whole); see engine/entrypoints/outputs.py.
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # vLLM's: mixed into the prefix cache's block hashes (its tiers' too), so that only
    # requests with the same salt share cached blocks (a tenant's, say).
    cache_salt: str | None = None
    # vLLM's thinking_token_budget: past it, the thinking section's end mark is forced.
    thinking_budget: ThinkingBudget | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValidationError(
                f"max_tokens must be an integer, got {self.max_tokens!r}", param="max_tokens"
            )
        if self.max_tokens < 1:
            raise ValidationError(
                f"max_tokens must be at least 1, got {self.max_tokens}", param="max_tokens"
            )
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise ValidationError(
                f"n must be an integer in [1, {MAX_N}], got {self.n!r}", param="n"
            )
        if not _is_number(self.temperature) or self.temperature < 0:
            raise ValidationError(
                f"temperature must be a number >= 0, got {self.temperature!r}", param="temperature"
            )
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValidationError(f"top_p must be in (0, 1], got {self.top_p!r}", param="top_p")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValidationError(
                f"top_k must be -1 (disabled) or a positive integer, got {self.top_k!r}",
                param="top_k",
            )
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValidationError(f"min_p must be in [0, 1], got {self.min_p!r}", param="min_p")
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not 0 <= self.seed < 2**63  # torch generators take int64
        ):
            raise ValidationError(
                f"seed must be an integer in [0, 2**63) or None, got {self.seed!r}", param="seed"
            )
        if self.top_k == 0:
            self.top_k = -1
        self._check_stops()
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise ValidationError(
                    f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}", param=name
                )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise ValidationError(f"{name} must be in [-2, 2], got {value!r}", param=name)
        if not _is_number(self.repetition_penalty) or not 0 < self.repetition_penalty <= 100:
            raise ValidationError(
                f"repetition_penalty must be in (0, 100], got {self.repetition_penalty!r}",
                param="repetition_penalty",
            )
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise ValidationError("json_schema must be a JSON schema object", param="json_schema")
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise ValidationError(
                    "structured_outputs must be a StructuredOutputsParams",
                    param="structured_outputs",
                )
            if self.json_schema is not None:
                raise ValidationError(
                    "json_schema and structured_outputs both constrain the output: give one",
                    param="structured_outputs",
                )
        if self.cache_salt is not None and not (
            isinstance(self.cache_salt, str) and self.cache_salt
        ):
            raise ValidationError("cache_salt must be a non-empty string", param="cache_salt")
        self._check_token_lists()
        if not isinstance(self.logit_bias, dict):
            raise ValidationError("logit_bias must map token ids to biases", param="logit_bias")
        if len(self.logit_bias) > MAX_TOKEN_ID_ENTRIES:
            raise ValidationError(
                f"logit_bias: at most {MAX_TOKEN_ID_ENTRIES} tokens, got {len(self.logit_bias)}",
                param="logit_bias",
            )
        for token_id, bias in self.logit_bias.items():
            if not _is_int(token_id) or token_id < 0:
                raise ValidationError(
                    f"logit_bias: token id {token_id!r} is not a token id", param="logit_bias"
                )
            if not _is_number(bias) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValidationError(
                    f"logit_bias: bias {bias!r} must be in [-100, 100]", param="logit_bias"
                )

    @functools.cached_property
    def stop_token_set(self) -> frozenset[int]:
        """stop_token_ids as a set: looked up at every token."""
        return frozenset(self.stop_token_ids)

    @functools.cached_property
    def logit_bias_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """logit_bias as (token ids int64, biases fp32): the sampler's, made once."""
        import torch  # here: the command line imports this module before torch may load

        return (
            torch.tensor(list(self.logit_bias), dtype=torch.int64),
            torch.tensor(list(self.logit_bias.values()), dtype=torch.float32),
        )

    def _check_stops(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise ValidationError("stop must be a string or a list of strings", param="stop")
        self.stop = [s for s in self.stop if s]  # "" would stop before the first token
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValidationError(
                f"stop: at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}", param="stop"
            )
        if any(len(s) > MAX_STOP_STRING_CHARS for s in self.stop):
            raise ValidationError(
                f"stop: each string must be at most {MAX_STOP_STRING_CHARS} chars", param="stop"
            )
        if not isinstance(self.stop_token_ids, list) or not all(
            _is_int(t) and t >= 0 for t in self.stop_token_ids
        ):
            raise ValidationError(
                "stop_token_ids must be a list of token ids", param="stop_token_ids"
            )
        if len(self.stop_token_ids) > MAX_TOKEN_ID_ENTRIES:
            raise ValidationError(
                f"stop_token_ids: at most {MAX_TOKEN_ID_ENTRIES} token ids, "
                f"got {len(self.stop_token_ids)}",
                param="stop_token_ids",
            )
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValidationError(
                f"min_tokens must be an integer >= 0, got {self.min_tokens!r}", param="min_tokens"
            )
        if self.min_tokens > self.max_tokens:
            raise ValidationError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
                param="min_tokens",
            )

    def _check_token_lists(self) -> None:
        allowed = self.allowed_token_ids
        if allowed is not None and not (
            isinstance(allowed, list) and allowed and all(_is_int(t) and t >= 0 for t in allowed)
        ):
            raise ValidationError(
                "allowed_token_ids must be a non-empty list of token ids",
                param="allowed_token_ids",
            )
        words = self.bad_words
        if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
            raise ValidationError("bad_words must be a list of words", param="bad_words")
        if len(words) > MAX_BAD_WORDS or any(len(w) > MAX_STOP_STRING_CHARS for w in words):
            raise ValidationError(
                f"bad_words: at most {MAX_BAD_WORDS} words of at most "
                f"{MAX_STOP_STRING_CHARS} characters",
                param="bad_words",
            )

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids the request names must exist: the sampler indexes logits with them."""
        named = (
            ("logit_bias", self.logit_bias),
            ("stop_token_ids", self.stop_token_ids),
            ("allowed_token_ids", self.allowed_token_ids or ()),
        )
        for name, ids in named:
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise ValidationError(
                    f"{name}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
                    param=name,
                )

    def allows_stop(self, num_output_tokens: int) -> bool:
        """Whether a sequence with this many output tokens may stop (min_tokens): before,
        eos and stop tokens are masked out and stop strings are not looked for."""
        return num_output_tokens >= self.min_tokens

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value
