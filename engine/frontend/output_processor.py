"""OutputProcessor: the scheduler's sequence updates -> RequestOutputs.

Per choice it keeps the detokenizer, the text so far, the logprobs and the timing, and
makes an immutable RequestOutput as the request's output kind says: after each step
that added a token or finished, holding everything so far (CUMULATIVE) or the step's
part only (DELTA: a stream's cost per token does not grow with its length), or once at
the end (FINAL_ONLY: an answer sent whole costs no output per step). Stop
strings are found here (they need text): the sequence that completes one is reported
back, for the scheduler to finish as stopped, as vLLM's output processor turns them
into aborts. Finished outputs are kept a while for ``get_output``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from hetero_infer.engine.core.step_data import Logprobs, SampledToken, SequenceUpdate
from hetero_infer.engine.frontend.parent_request import ParentRequest
from hetero_infer.engine.frontend.stop_strings import StopStringMatcher
from hetero_infer.engine.metrics import EngineMetrics
from hetero_infer.engine.outputs import RequestMetrics, RequestOutput
from hetero_infer.engine.sampling_params import RequestOutputKind, SamplingParams
from hetero_infer.engine.tokenizer import IncrementalDetokenizer, Tokenizer

# Finished requests kept for get_output() after they end.
MAX_FINISHED_KEPT = 4096


@dataclass
class _ChoiceState:
    request_id: str
    parent: ParentRequest
    index: int
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
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


@dataclass
class ProcessedOutputs:
    outputs: list[RequestOutput]
    # Sequences that completed a stop string, for the scheduler to finish.
    stopped: list[str]


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, metrics: EngineMetrics) -> None:
        self.tokenizer = tokenizer
        self.metrics = metrics
        self._choices: dict[str, _ChoiceState] = {}
        self._parents: dict[str, ParentRequest] = {}
        self._finished: OrderedDict[str, RequestOutput] = OrderedDict()

    def add_request(
        self, parent: ParentRequest, prompt: str | None, prompt_token_ids: list[int]
    ) -> None:
        now = time.monotonic()
        prompt_logprobs = [None] if parent.params.prompt_logprobs is not None else None
        for index, request_id in enumerate(parent.choice_ids):
            params = parent.choice_params(index)
            self._choices[request_id] = _ChoiceState(
                request_id=request_id,
                parent=parent,
                index=index,
                prompt=prompt,
                prompt_token_ids=list(prompt_token_ids),
                params=params,
                detokenizer=IncrementalDetokenizer(
                    self.tokenizer, prompt_token_ids, params.skip_special_tokens
                ),
                stops=StopStringMatcher(params.stop, params.include_stop_str_in_output)
                if params.stop
                else None,
                arrival_time=now,
                logprobs=[] if params.logprobs is not None else None,
                prompt_logprobs=prompt_logprobs,
            )
        self._parents[parent.request_id] = parent

    def is_known(self, request_id: str) -> bool:
        """Whether the id names a request (or a choice) running or still kept."""
        return request_id in self._choices or request_id in self._finished

    def choice_ids(self, request_id: str) -> list[str]:
        parent = self._parents.get(request_id)
        return parent.choice_ids if parent is not None else [request_id]

    def get_finished(self, request_id: str) -> RequestOutput | None:
        return self._finished.get(request_id)

    def pop_finished(self, request_id: str) -> RequestOutput:
        return self._finished.pop(request_id)

    def process(self, updates: list[SequenceUpdate]) -> ProcessedOutputs:
        outputs, stopped = [], []
        for update in updates:
            state = self._choices.get(update.request_id)
            if state is None:  # aborted since its step
                continue
            if not update.new_tokens and update.finish_reason is None:
                # A prompt chunk: nothing to show, but its prompt logprobs are kept.
                if state.prompt_logprobs is not None:
                    state.prompt_logprobs.extend(update.new_prompt_logprobs)
                continue
            output, stopped_here = self._advance(state, update)
            if output is not None:
                outputs.append(output)
            if stopped_here:
                stopped.append(update.request_id)
        return ProcessedOutputs(outputs, stopped)

    def abort(self, request_id: str) -> bool:
        """Finish a choice as aborted; False if it is not running."""
        state = self._choices.get(request_id)
        if state is None:
            return False
        self._finish(state, self._snapshot(state, "", [], "abort", time.monotonic()))
        return True

    def _advance(
        self, state: _ChoiceState, update: SequenceUpdate
    ) -> tuple[RequestOutput | None, bool]:
        """Apply one update to a choice; (its output, None where its kind wants none yet;
        whether a stop string ended it).

        An update may bring several tokens (accepted draft tokens): they are decoded and
        searched for stop strings one at a time, so a stop string ends the output at the
        token that completes it, as it would have one token per step."""
        if state.prompt_logprobs is not None:
            state.prompt_logprobs.extend(update.new_prompt_logprobs)
        state.first_scheduled_time = update.first_scheduled_time
        state.num_preemptions = update.num_preemptions
        state.stop_reason = update.stop_reason
        state.embedding = update.embedding
        finish_reason = update.finish_reason
        new_ids: list[int] = []
        sent_before = len(state.decoded)
        send_to, stopped = len(state.decoded), False
        first_output = update.num_output_tokens - len(update.new_tokens)
        for i, token in enumerate(update.new_tokens):
            self._add_token(state, token)
            new_ids.append(token.token_id)
            last = i == len(update.new_tokens) - 1
            old_len = len(state.decoded)
            self._decode(state, token.token_id, finish_reason if last else None)
            send_to, stopped = self._check_stop_strings(state, old_len, first_output + i + 1)
            if stopped:
                break
        if not update.new_tokens:
            if finish_reason is not None:
                state.decoded += state.detokenizer.flush()
            send_to, stopped = self._check_stop_strings(
                state, sent_before, update.num_output_tokens
            )
        if stopped:
            finish_reason = "stop"
        elif finish_reason is None and state.stops is not None:
            send_to -= state.stops.held_back(state.decoded)
        send_to = max(send_to, state.sent)  # the hold-back never lets a sent char become a stop
        delta = state.decoded[state.sent : send_to]
        state.sent = send_to
        kind = state.params.output_kind
        if kind is RequestOutputKind.FINAL_ONLY and new_ids:
            self._note_token_time(state, len(new_ids))
        if kind is RequestOutputKind.FINAL_ONLY and finish_reason is None:
            return None, stopped
        # A stop string ends the request now; the scheduler's own finish came with the update.
        finished_time = time.monotonic() if stopped else update.finished_time
        output = self._snapshot(state, delta, new_ids, finish_reason, finished_time)
        if finish_reason is not None:
            self._finish(state, output)
        return output, stopped

    def _note_token_time(self, state: _ChoiceState, num_tokens: int) -> None:
        """FINAL_ONLY: the gap since the last token-bearing step, for the latency metrics
        that a stream's outputs give as they come."""
        now = time.monotonic()
        if state.last_token_time is not None:
            state.token_gaps.append((now - state.last_token_time, num_tokens))
        state.last_token_time = now

    def _add_token(self, state: _ChoiceState, token: SampledToken) -> None:
        state.token_ids.append(token.token_id)
        # Logprobs are computed only where asked (else the token's is NaN).
        if state.logprobs is not None:
            state.cumulative_logprob += token.logprob
            state.logprobs.append(token.top_logprobs or {token.token_id: token.logprob})
        if state.first_token_time is None:
            state.first_token_time = time.monotonic()

    def _decode(self, state: _ChoiceState, token_id: int, finish_reason: str | None) -> None:
        """Add a token's text; ``finish_reason``: the update's, for its last token."""
        if not self._drops_text(state, token_id, finish_reason):
            state.decoded += state.detokenizer.step([token_id])
        if finish_reason is not None:
            state.decoded += state.detokenizer.flush()

    def _drops_text(self, state: _ChoiceState, token_id: int, finish_reason: str | None) -> bool:
        """Whether the token that ends a request leaves its text out: a stop_token_ids
        token does, as in vLLM (unless include_stop_str_in_output), and so does eos
        (decoding drops it anyway where it skips special tokens)."""
        if finish_reason is None:
            return False
        if state.stop_reason is not None and not state.params.include_stop_str_in_output:
            return True
        return self._ended_by_eos(state, [token_id], finish_reason)

    def _ended_by_eos(
        self, state: _ChoiceState, new_ids: list[int], finish_reason: str | None
    ) -> bool:
        return (
            not state.params.skip_special_tokens
            and finish_reason == "stop"
            and not state.params.ignore_eos
            and bool(new_ids)
            and new_ids[-1] in self.tokenizer.eos_token_ids
        )

    def _check_stop_strings(
        self, state: _ChoiceState, old_len: int, num_output_tokens: int
    ) -> tuple[int, bool]:
        """(how far the text may be sent, whether a stop string ended it)."""
        if state.stops is None or not state.params.allows_stop(num_output_tokens):
            return len(state.decoded), False
        found = state.stops.find(state.decoded, old_len)
        if found is None:
            return len(state.decoded), False
        # Over a length finish in the same step too: the stop string came first.
        end, state.stop_reason = found
        state.decoded = state.decoded[:end]
        return end, True

    def _snapshot(
        self,
        state: _ChoiceState,
        delta_text: str,
        new_ids: list[int],
        finish_reason: str | None,
        finished_time: float | None,
    ) -> RequestOutput:
        finished = finish_reason is not None
        kind = state.params.output_kind
        if kind is RequestOutputKind.DELTA:
            text, token_ids = delta_text, new_ids
            logprobs = None
            if state.logprobs is not None:
                logprobs = state.logprobs[state.logprobs_sent :]
                state.logprobs_sent = len(state.logprobs)
            prompt_logprobs = None if state.prompt_logprobs_sent else state.prompt_logprobs
            state.prompt_logprobs_sent = True
        else:
            # FINAL_ONLY hands over the choice's own lists: nothing changes them after.
            final = kind is RequestOutputKind.FINAL_ONLY
            text = state.decoded[: state.sent]
            token_ids = state.token_ids if final else list(state.token_ids)
            logprobs = state.logprobs
            if logprobs is not None and not final:
                logprobs = list(logprobs)
            prompt_logprobs = state.prompt_logprobs
        return RequestOutput(
            request_id=state.request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            text=text,
            token_ids=token_ids,
            finished=finished,
            finish_reason=finish_reason,
            cumulative_logprob=state.cumulative_logprob if state.logprobs is not None else None,
            metrics=RequestMetrics(
                arrival_time=state.arrival_time,
                first_scheduled_time=state.first_scheduled_time,
                first_token_time=state.first_token_time,
                finished_time=finished_time,
                num_preemptions=state.num_preemptions,
                token_gaps=tuple(state.token_gaps),
            ),
            delta_text=delta_text,
            delta_token_ids=new_ids,
            stop_reason=state.stop_reason if finished else None,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            index=state.index,
            group_id=state.parent.request_id,
            embedding=state.embedding,
        )

    def _finish(self, state: _ChoiceState, output: RequestOutput) -> None:
        del self._choices[state.request_id]
        parent_id = state.parent.request_id
        if all(i not in self._choices for i in state.parent.choice_ids):
            self._parents.pop(parent_id, None)
        self._finished[state.request_id] = output
        while len(self._finished) > MAX_FINISHED_KEPT:
            self._finished.popitem(last=False)
        self.metrics.requests_processed += 1
        self.metrics.total_latency += output.metrics.latency or 0.0
