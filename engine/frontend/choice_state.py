"""One choice of a request as the front end sees it: its text so far (decoded a token
at a time, searched for stop strings), logprobs and timing, and the RequestOutput
made of them as the request's output kind says."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hetero_infer.engine.core.step_data import Logprobs, SampledToken
from hetero_infer.engine.entrypoints.outputs import RequestMetrics, RequestOutput
from hetero_infer.engine.frontend.parent_request import ParentRequest
from hetero_infer.engine.frontend.stop_strings import StopStringMatcher
from hetero_infer.engine.params.sampling_params import RequestOutputKind, SamplingParams
from hetero_infer.engine.tokenizer import Detokenizer


@dataclass
class ChoiceState:
    request_id: str
    parent: ParentRequest
    index: int
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: Detokenizer
    eos_token_ids: frozenset[int]
    stops: StopStringMatcher | None
    arrival_time: float
    token_ids: list[int] = field(default_factory=list)
    decoded: str = ""  # all text decoded so far; ``sent`` chars of it went out
    sent: int = 0
    cumulative_logprob: float = 0.0
    logprobs: list[Logprobs] | None = None
    # Shared by every choice of a request: choice 0 computes the prompt.
    prompt_logprobs: list[Logprobs | None] | None = None
    first_scheduled_time: float | None = None
    num_cached_tokens: int = 0
    first_token_time: float | None = None
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    embedding: list[float] | None = None
    # DELTA: the logprob entries already sent, and whether the prompt's went out.
    logprobs_sent: int = 0
    prompt_logprobs_sent: bool = False
    # FINAL_ONLY: when the last token-bearing step ended, and (gap, tokens) since.
    last_token_time: float | None = None
    token_gaps: list[tuple[float, int]] = field(default_factory=list)
    # FINAL_ONLY without stop strings: no text is read before the end, so the ids wait
    # here and are decoded at once as the choice ends (None: decoded a token at a time).
    undecoded: list[int] | None = None

    def note_token_time(self, num_tokens: int) -> None:
        """FINAL_ONLY: the gap since the last token-bearing step, for the latency metrics
        that a stream's outputs give as they come."""
        now = time.monotonic()
        if self.last_token_time is not None:
            self.token_gaps.append((now - self.last_token_time, num_tokens))
        self.last_token_time = now

    def add_token(self, token: SampledToken) -> None:
        self.token_ids.append(token.token_id)
        # Logprobs are computed only where asked (else the token's is NaN).
        if self.logprobs is not None:
            self.cumulative_logprob += token.logprob
            self.logprobs.append(token.top_logprobs or {token.token_id: token.logprob})
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()

    def decode(self, token_id: int, finish_reason: str | None) -> None:
        """Add a token's text; ``finish_reason``: the update's, for its last token."""
        if finish_reason is None or not self._drops_text(token_id, finish_reason):
            if self.undecoded is not None:
                self.undecoded.append(token_id)
            else:
                self.decoded += self.detokenizer.step([token_id])
        if finish_reason is not None:
            self.finish_text()

    def decode_undecoded(self) -> None:
        """Decode the ids that waited (FINAL_ONLY) in one go: by the detokenizers'
        contract, a run of ids gives the text of the same ids a step at a time."""
        if self.undecoded:
            self.decoded += self.detokenizer.step(self.undecoded)
            self.undecoded.clear()

    def finish_text(self) -> None:
        """The text's end: what the detokenizer held back (a character cut short)."""
        self.decode_undecoded()
        self.decoded += self.detokenizer.flush()

    def _drops_text(self, token_id: int, finish_reason: str) -> bool:
        """Whether the token that ends a request leaves its text out: a stop_token_ids
        token does, as in vLLM (unless include_stop_str_in_output), and so does eos
        (decoding drops it anyway where it skips special tokens)."""
        if self.stop_reason is not None and not self.params.include_stop_str_in_output:
            return True
        return (
            not self.params.skip_special_tokens
            and finish_reason == "stop"
            and not self.params.ignore_eos
            and token_id in self.eos_token_ids
        )

    def check_stop_strings(self, old_len: int, num_output_tokens: int) -> tuple[int, bool]:
        """(how far the text may be sent, whether a stop string ended it)."""
        if self.stops is None or not self.params.allows_stop(num_output_tokens):
            return len(self.decoded), False
        found = self.stops.find(self.decoded, old_len)
        if found is None:
            return len(self.decoded), False
        # Over a length finish in the same step too: the stop string came first.
        end, self.stop_reason = found
        self.decoded = self.decoded[:end]
        return end, True

    def snapshot(
        self,
        delta_text: str,
        new_ids: list[int],
        finish_reason: str | None,
        finished_time: float | None,
    ) -> RequestOutput:
        finished = finish_reason is not None
        kind = self.params.output_kind
        if kind is RequestOutputKind.DELTA:
            text, token_ids = delta_text, new_ids
            logprobs = None
            if self.logprobs is not None:
                logprobs = self.logprobs[self.logprobs_sent :]
                self.logprobs_sent = len(self.logprobs)
            prompt_logprobs = None if self.prompt_logprobs_sent else self.prompt_logprobs
            self.prompt_logprobs_sent = True
        else:
            # FINAL_ONLY hands over the choice's own lists: nothing changes them after.
            final = kind is RequestOutputKind.FINAL_ONLY
            text = self.decoded[: self.sent]
            token_ids = self.token_ids if final else list(self.token_ids)
            logprobs = self.logprobs
            if logprobs is not None and not final:
                logprobs = list(logprobs)
            prompt_logprobs = self.prompt_logprobs
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            text=text,
            token_ids=token_ids,
            finished=finished,
            finish_reason=finish_reason,
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            metrics=RequestMetrics(
                arrival_time=self.arrival_time,
                first_scheduled_time=self.first_scheduled_time,
                first_token_time=self.first_token_time,
                finished_time=finished_time,
                num_preemptions=self.num_preemptions,
                token_gaps=tuple(self.token_gaps),
            ),
            delta_text=delta_text,
            delta_token_ids=new_ids,
            stop_reason=self.stop_reason if finished else None,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            index=self.index,
            group_id=self.parent.request_id,
            embedding=self.embedding,
            num_cached_tokens=self.num_cached_tokens,
        )
