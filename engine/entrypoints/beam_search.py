"""Beam search over the engine's own requests, as vLLM's v1 runs it: above the engine.

Each round every live beam is a request for one token with the logprobs of its best
candidates; the search keeps the best ``beam_width`` continuations and the best ended
hypotheses, scored as transformers' ``generate(num_beams=...)`` scores them: the sum of
the tokens' logprobs over ``generated_length ** length_penalty``, and ``early_stopping``
(True, False or "never") ends the search as its beam search does. So a search here
gives transformers' beams, token for token, and width 1 is greedy decoding.

A beam's request finds its prompt and earlier tokens in the prefix cache: every full
block is taken from there, but the partly filled last block is computed again each
round (at most ``block_size`` tokens per beam per round, ``block_size / 2`` on
average), since a finished request's partial block is never cached.

``BeamSearch`` is the search, which knows no engine; engine/entrypoints/beam_search_runner.py
drives it through an LLMEngine (the offline API) or the server's AsyncEngine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hetero_infer.engine.entrypoints.outputs import RequestMetrics, RequestOutput
from hetero_infer.engine.frontend.parent_request import choice_id
from hetero_infer.engine.params.sampling_params import (
    MAX_LOGPROBS,
    RequestOutputKind,
    SamplingParams,
)
from hetero_infer.engine.settings.exceptions import ValidationError
from hetero_infer.engine.tokenizer.detokenizer import new_detokenizer

if TYPE_CHECKING:
    from hetero_infer.engine.tokenizer import Tokenizer

EARLY_STOPPING = (True, False, "never")


@dataclass(frozen=True)
class BeamSearchParams:
    """How one prompt is searched; transformers' names in its GenerationConfig are
    num_beams, max_new_tokens, length_penalty and early_stopping."""

    beam_width: int = 1
    max_tokens: int = 16
    # Scores are sum(logprobs) / generated_length ** length_penalty: > 0 favours longer
    # hypotheses, < 0 shorter ones.
    length_penalty: float = 1.0
    # True: end once beam_width hypotheses have ended; False: once the best live beam,
    # at its current length, cannot beat the worst of them; "never": once it cannot at
    # any length up to max_tokens (the canonical beam search).
    early_stopping: bool | str = False
    ignore_eos: bool = False
    # Tokens that end a hypothesis as eos does (vLLM's stop_token_ids).
    stop_token_ids: tuple[int, ...] = ()
    # A stop_token_ids token's text is left out unless this is set (eos's text as in
    # the engine's own outputs: left out where special tokens are).
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def __post_init__(self) -> None:
        width = self.beam_width
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValidationError(f"beam width (n) must be an integer >= 1, got {width!r}", "n")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValidationError("max_tokens must be an integer", param="max_tokens")
        if self.max_tokens < 1:
            raise ValidationError("max_tokens must be at least 1", param="max_tokens")
        penalty = self.length_penalty
        if isinstance(penalty, bool) or not isinstance(penalty, int | float):
            raise ValidationError("length_penalty must be a number", param="length_penalty")
        if not math.isfinite(penalty):
            raise ValidationError("length_penalty must be finite", param="length_penalty")
        if not any(self.early_stopping is ok for ok in EARLY_STOPPING):
            raise ValidationError(
                'early_stopping must be true, false or "never"', param="early_stopping"
            )


def num_candidates(params: BeamSearchParams, eos_token_ids: Iterable[int]) -> int:
    """The candidates a round keeps, and so the logprobs each beam asks for. As
    transformers: (1 + ending tokens) * width, at least 2 * width, so that width of
    them go on even if every ending token is among each beam's best. ValidationError
    (naming n) past the logprobs a request may ask for."""
    ends = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    per_beam = max(2, 1 + len(ends))
    if per_beam * params.beam_width > MAX_LOGPROBS:
        raise ValidationError(
            f"beam search takes n (the beam width) of at most {MAX_LOGPROBS // per_beam} "
            f"here: each beam's best {per_beam} * n tokens are scored, and at most "
            f"{MAX_LOGPROBS} logprobs are computed per token",
            param="n",
        )
    return per_beam * params.beam_width


@dataclass(frozen=True)
class BeamHypothesis:
    """A hypothesis: its generated tokens, the sum of their logprobs, its
    length-penalized score, and why it ended ("stop", "length"; "error" for a search
    a failed step ended)."""

    token_ids: tuple[int, ...]
    cumulative_logprob: float
    score: float
    finish_reason: str
    stop_reason: int | None = None


@dataclass(frozen=True)
class _Beam:
    token_ids: tuple[int, ...]
    cumulative_logprob: float


class BeamSearch:
    """One prompt's search: ``prompts()`` are this round's requests (prompt + each live
    beam's tokens), ``advance`` takes their top logprobs, until ``done``."""

    def __init__(
        self, prompt_token_ids: list[int], params: BeamSearchParams, eos_token_ids: Iterable[int]
    ) -> None:
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.eos_token_ids = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self.ends = self.eos_token_ids | frozenset(params.stop_token_ids)
        self.num_candidates = num_candidates(params, eos_token_ids)
        self.running = [_Beam((), 0.0)]
        self.finished: list[BeamHypothesis] = []  # best first, at most width of them
        self.num_generated = 0
        self.done = False

    def round_params(self) -> SamplingParams:
        """The params of every beam's request: one greedy token and the logprobs of the
        best candidates (their log-softmax over the model's raw logits)."""
        return SamplingParams(
            max_tokens=1,
            temperature=0.0,
            logprobs=self.num_candidates,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def prompts(self) -> list[list[int]]:
        """This round's requests: the prompt and each live beam's tokens (none once done)."""
        if self.done:
            return []
        return [self.prompt_token_ids + list(beam.token_ids) for beam in self.running]

    def advance(self, top_logprobs: list[Mapping[int, float]]) -> None:
        """One round: each live beam's {token: logprob} for its best candidates."""
        assert not self.done and len(top_logprobs) == len(self.running)
        width, penalty = self.params.beam_width, self.params.length_penalty
        candidates = [
            (beam.cumulative_logprob + logprob, token, beam)
            for beam, row in zip(self.running, top_logprobs, strict=True)
            for token, logprob in row.items()
        ]
        # transformers' top-k over beams * vocab; a stable sort keeps ties in beam order.
        candidates.sort(key=lambda c: c[0], reverse=True)
        candidates = candidates[: self.num_candidates]
        length = self.num_generated + 1
        at_limit = length >= self.params.max_tokens
        ends = [at_limit or token in self.ends for _, token, _ in candidates]
        self.running = [
            _Beam((*beam.token_ids, token), logprob)
            for (logprob, token, beam), end in zip(candidates, ends, strict=True)
            if not end
        ][:width]
        # Only the width best candidates may become hypotheses (the rest are there so
        # that width beams go on); a new one must beat the worst kept.
        for (logprob, token, beam), end in zip(candidates[:width], ends[:width], strict=True):
            if end:
                self.finished.append(self._hypothesis((*beam.token_ids, token), logprob))
        self.finished.sort(key=lambda h: h.score, reverse=True)
        del self.finished[width:]
        self.num_generated = length
        full = len(self.finished) == width
        self.done = (
            all(ends)
            or not self.running
            or (full and self.params.early_stopping is True)
            or (full and not self._can_improve(penalty))
        )

    def cut_short(self, finish_reason: str) -> None:
        """End the search now (a time limit, a failed step): the live beams (with a
        token) count as hypotheses of their length, ended for ``finish_reason``."""
        for beam in self.running:
            if beam.token_ids:
                penalized = (
                    beam.cumulative_logprob / len(beam.token_ids) ** self.params.length_penalty
                )
                self.finished.append(
                    BeamHypothesis(
                        beam.token_ids, beam.cumulative_logprob, penalized, finish_reason
                    )
                )
        self.finished.sort(key=lambda h: h.score, reverse=True)
        del self.finished[self.params.beam_width :]
        self.running = []
        self.done = True

    def _can_improve(self, penalty: float) -> bool:
        """transformers' test of whether the best live beam could still beat the worst
        hypothesis kept: at its current length, or with "never" and a positive penalty,
        at max_tokens (a longer hypothesis is then divided by more)."""
        if self.params.early_stopping == "never" and penalty > 0:
            best_length = self.params.max_tokens
        else:
            best_length = self.num_generated
        best_possible = self.running[0].cumulative_logprob / best_length**penalty
        return best_possible > self.finished[-1].score

    def _hypothesis(self, token_ids: tuple[int, ...], logprob: float) -> BeamHypothesis:
        last = token_ids[-1]
        if last in self.ends:
            stop_reason = last if last not in self.eos_token_ids else None
            reason = "stop"
        else:
            stop_reason, reason = None, "length"
        score = logprob / len(token_ids) ** self.params.length_penalty
        return BeamHypothesis(token_ids, logprob, score, reason, stop_reason)

    def outputs(
        self,
        request_id: str,
        prompt: str | None,
        tokenizer: Tokenizer,
        metrics: RequestMetrics,
    ) -> list[RequestOutput]:
        """The finished search as a request's outputs, one per hypothesis, best first
        (``index`` 0 the best), each whole (its delta fields hold all of it too)."""
        assert self.done
        outputs = []
        for index, hyp in enumerate(self.finished):
            token_ids = list(hyp.token_ids)
            # The text reads as the engine's own outputs do (frontend/choice_state.py):
            # decoded after the prompt, as its reader sees it; an ending stop token's text
            # left out unless include_stop_str_in_output, eos's by the decoder's skipping
            # of special tokens, or, where those are kept, here.
            ending = hyp.finish_reason == "stop"
            if hyp.stop_reason is not None:
                drop = ending and not self.params.include_stop_str_in_output
            else:
                drop = ending and not self.params.skip_special_tokens
            shown = token_ids[:-1] if drop else token_ids
            detokenizer = new_detokenizer(
                tokenizer,
                self.prompt_token_ids,
                self.params.skip_special_tokens,
                self.params.spaces_between_special_tokens,
            )
            text = detokenizer.step(shown) + detokenizer.flush()
            outputs.append(
                RequestOutput(
                    request_id=choice_id(request_id, index),
                    prompt=prompt,
                    prompt_token_ids=self.prompt_token_ids,
                    text=text,
                    token_ids=token_ids,
                    finished=True,
                    finish_reason=hyp.finish_reason,
                    cumulative_logprob=hyp.cumulative_logprob,
                    metrics=metrics,
                    delta_text=text,
                    delta_token_ids=token_ids,
                    stop_reason=hyp.stop_reason,
                    index=index,
                    group_id=request_id,
                )
            )
        return outputs
