"""OutputProcessor: the scheduler's sequence updates -> RequestOutputs.

Per choice it keeps the detokenizer, the text so far, the logprobs and the timing, and
makes a RequestOutput snapshot as the request's output kind says: after each step
that added a token or finished, holding everything so far (CUMULATIVE) or the step's
part only (DELTA: a stream's cost per token does not grow with its length), or once at
the end (FINAL_ONLY: an answer sent whole costs no output per step, and without stop
strings no text either: its ids are decoded at once as it ends). Stop
strings are found here (they need text): the sequence that completes one is reported
back, for the scheduler to finish as stopped, as vLLM's output processor turns them
into aborts. Finished outputs are kept a while for ``get_output``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from hetero_infer.engine.core.step_data import SequenceUpdate
from hetero_infer.engine.entrypoints.metrics import EngineMetrics
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.frontend.choice_state import ChoiceState
from hetero_infer.engine.frontend.parent_request import ParentRequest
from hetero_infer.engine.frontend.stop_strings import StopStringMatcher
from hetero_infer.engine.params.sampling_params import RequestOutputKind
from hetero_infer.engine.tokenizer import Tokenizer, new_detokenizer

# Finished requests kept for get_output() after they end.
MAX_FINISHED_KEPT = 4096


@dataclass
class ProcessedOutputs:
    outputs: list[RequestOutput]
    # Sequences that completed a stop string, for the scheduler to finish.
    stopped: list[str]


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, metrics: EngineMetrics) -> None:
        self.tokenizer = tokenizer
        self.metrics = metrics
        self._choices: dict[str, ChoiceState] = {}
        self._parents: dict[str, ParentRequest] = {}
        self._finished: OrderedDict[str, RequestOutput] = OrderedDict()

    def add_request(
        self, parent: ParentRequest, prompt: str | None, prompt_token_ids: list[int]
    ) -> None:
        now = time.monotonic()
        prompt_logprobs = [None] if parent.params.prompt_logprobs is not None else None
        for index, request_id in enumerate(parent.choice_ids):
            params = parent.choice_params(index)
            # Text that nothing reads before the end is decoded there (ChoiceState.undecoded).
            text_at_end = params.output_kind is RequestOutputKind.FINAL_ONLY and not params.stop
            self._choices[request_id] = ChoiceState(
                request_id=request_id,
                parent=parent,
                index=index,
                prompt=prompt,
                prompt_token_ids=list(prompt_token_ids),
                params=params,
                detokenizer=new_detokenizer(
                    self.tokenizer,
                    prompt_token_ids,
                    params.skip_special_tokens,
                    params.spaces_between_special_tokens,
                ),
                eos_token_ids=self.tokenizer.eos_token_ids,
                stops=StopStringMatcher(params.stop, params.include_stop_str_in_output)
                if params.stop
                else None,
                arrival_time=now,
                logprobs=[] if params.logprobs is not None else None,
                prompt_logprobs=prompt_logprobs,
                undecoded=[] if text_at_end else None,
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
        if state.undecoded is not None:  # the text so far, as decoded a step at a time
            state.decode_undecoded()
            state.sent = len(state.decoded)
        self._finish(state, state.snapshot("", [], "abort", time.monotonic()))
        return True

    def _advance(
        self, state: ChoiceState, update: SequenceUpdate
    ) -> tuple[RequestOutput | None, bool]:
        """Apply one update to a choice; (its output, None where its kind wants none yet;
        whether a stop string ended it).

        An update may bring several tokens (accepted draft tokens): they are decoded and
        searched for stop strings one at a time, so a stop string ends the output at the
        token that completes it, as it would have one token per step."""
        if state.prompt_logprobs is not None:
            state.prompt_logprobs.extend(update.new_prompt_logprobs)
        state.first_scheduled_time = update.first_scheduled_time
        state.num_cached_tokens = update.num_cached_tokens
        state.num_preemptions = update.num_preemptions
        state.stop_reason = update.stop_reason
        state.embedding = update.embedding
        finish_reason = update.finish_reason
        if state.undecoded is not None and finish_reason is None:
            # FINAL_ONLY without stop strings, before its end: the ids wait, nothing goes out.
            for token in update.new_tokens:
                state.add_token(token)
                state.undecoded.append(token.token_id)
            state.note_token_time(len(update.new_tokens))
            return None, False
        new_ids: list[int] = []
        sent_before = len(state.decoded)
        send_to, stopped = len(state.decoded), False
        first_output = update.num_output_tokens - len(update.new_tokens)
        for i, token in enumerate(update.new_tokens):
            state.add_token(token)
            new_ids.append(token.token_id)
            last = i == len(update.new_tokens) - 1
            old_len = len(state.decoded)
            state.decode(token.token_id, finish_reason if last else None)
            send_to, stopped = state.check_stop_strings(old_len, first_output + i + 1)
            if stopped:
                break
        if not update.new_tokens:
            if finish_reason is not None:
                state.finish_text()
            send_to, stopped = state.check_stop_strings(sent_before, update.num_output_tokens)
        if stopped:
            finish_reason = "stop"
        elif finish_reason is None and state.stops is not None:
            send_to -= state.stops.held_back(state.decoded)
        send_to = max(send_to, state.sent)  # the hold-back never lets a sent char become a stop
        delta = state.decoded[state.sent : send_to]
        state.sent = send_to
        kind = state.params.output_kind
        if kind is RequestOutputKind.FINAL_ONLY and new_ids:
            state.note_token_time(len(new_ids))
        if kind is RequestOutputKind.FINAL_ONLY and finish_reason is None:
            return None, stopped
        # A stop string ends the request now; the scheduler's own finish came with the update.
        finished_time = time.monotonic() if stopped else update.finished_time
        output = state.snapshot(delta, new_ids, finish_reason, finished_time)
        if finish_reason is not None:
            self._finish(state, output)
        return output, stopped

    def _finish(self, state: ChoiceState, output: RequestOutput) -> None:
        del self._choices[state.request_id]
        parent_id = state.parent.request_id
        if all(i not in self._choices for i in state.parent.choice_ids):
            self._parents.pop(parent_id, None)
        self._finished[state.request_id] = output
        while len(self._finished) > MAX_FINISHED_KEPT:
            self._finished.popitem(last=False)
        self.metrics.requests_processed += 1
        self.metrics.total_latency += output.metrics.latency or 0.0
