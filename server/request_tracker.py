"""One request's outputs, observed into the server's request histograms as they arrive
(the latencies, the phases, the token counts), each choice on its own."""

from __future__ import annotations

import time

from hetero_infer.engine.entrypoints.outputs import RequestMetrics, RequestOutput
from hetero_infer.server.server_metrics import ServerMetrics


class RequestTracker:
    """Observes one request's outputs as they arrive; ``final_only``: it gets only its
    finished ones (RequestOutputKind.FINAL_ONLY)."""

    def __init__(self, metrics: ServerMetrics, final_only: bool) -> None:
        self.metrics = metrics
        self.final_only = final_only
        self.started = time.monotonic()
        # By choice (its request id): when its last tokens came, how many so far, and
        # its latest output. A request's n choices stream side by side, each timed on
        # its own, as vLLM does.
        self.last_token_time: dict[str, float] = {}
        self.generated: dict[str, int] = {}
        self.latest: dict[str, RequestOutput] = {}

    def observe(self, output: RequestOutput) -> None:
        m, name = self.metrics, self.metrics.model_name
        now = time.monotonic()
        self.latest[output.request_id] = output
        if self.final_only:
            # The engine timed the steps that a stream's outputs would have shown.
            timing = output.metrics
            if timing.first_token_time is not None:
                m.ttft.labels(name).observe(timing.first_token_time - timing.arrival_time)
            for gap, num_tokens in timing.token_gaps:
                for _ in range(num_tokens):
                    self._token_gap(gap / num_tokens)
            self.generated[output.request_id] = len(output.token_ids)
        elif output.delta_token_ids:
            last = self.last_token_time.get(output.request_id)
            if last is None:
                m.ttft.labels(name).observe(now - output.metrics.arrival_time)
            else:
                # Several tokens in one output share the gap evenly.
                gap = (now - last) / len(output.delta_token_ids)
                for _ in output.delta_token_ids:
                    self._token_gap(gap)
            self.last_token_time[output.request_id] = now
            count = self.generated.get(output.request_id, 0) + len(output.delta_token_ids)
            self.generated[output.request_id] = count
        if output.finished:
            self._choice_ended(output, output.finish_reason, now)

    def abandoned(self, num_prompt_tokens: int, n: int, max_tokens: int | None) -> None:
        """The request ended before its choices did (its client went away): each one
        not finished counts as aborted, with what it had done, so that the requests'
        histograms hold every request the engine took (vLLM's leave aborted requests
        out, while its prompt_tokens_total counts their prompts); then ``done``."""
        now = time.monotonic()
        for output in self.latest.values():
            if not output.finished:
                self._choice_ended(output, "abort", now)
        for _ in range(n - len(self.latest)):  # choices with no output yet
            arrived = RequestMetrics(arrival_time=self.started)
            self._ended("abort", arrived, num_prompt_tokens, 0, 0, now)
        self.done(max_tokens, n)

    def done(self, max_tokens: int | None, n: int) -> None:
        """The request has ended, every choice of it: its request-wide histograms."""
        m, name = self.metrics, self.metrics.model_name
        m.params_n.labels(name).observe(n)
        if max_tokens is not None:
            m.tokens["request_params_max_tokens"].labels(name).observe(max_tokens)
        if self.generated:
            most = max(self.generated.values())
            m.tokens["request_max_num_generation_tokens"].labels(name).observe(most)
            m.tokens["max_num_generation_tokens"].labels(name).observe(most)

    def _token_gap(self, gap: float) -> None:
        name = self.metrics.model_name
        self.metrics.itl.labels(name).observe(gap)
        self.metrics.tpot.labels(name).observe(gap)

    def _choice_ended(self, output: RequestOutput, reason: str | None, now: float) -> None:
        generated = self.generated.get(output.request_id, 0)
        prompt, cached = len(output.prompt_token_ids), output.num_cached_tokens
        self._ended(reason, output.metrics, prompt, cached, generated, now)

    def _ended(
        self,
        reason: str | None,
        timing: RequestMetrics,
        num_prompt_tokens: int,
        num_cached_tokens: int,
        num_generated: int,
        now: float,
    ) -> None:
        """A choice has ended: its latencies, phases and token counts (``num_cached_tokens``:
        those of its prompt the prefix cache held)."""
        m, name = self.metrics, self.metrics.model_name
        m.request_success.labels(name, reason or "error").inc()
        m.e2e.labels(name).observe(now - timing.arrival_time)
        m.tokens["request_prompt_tokens"].labels(name).observe(num_prompt_tokens)
        m.tokens["request_generation_tokens"].labels(name).observe(num_generated)
        scheduled, first_token = timing.first_scheduled_time, timing.first_token_time
        if scheduled is None:
            return
        m.prompt_tokens_cached.labels(name).inc(num_cached_tokens)
        computed = num_prompt_tokens - num_cached_tokens
        m.tokens["request_prefill_kv_computed_tokens"].labels(name).observe(computed)
        m.queue_time.labels(name).observe(scheduled - timing.arrival_time)
        finished = timing.finished_time or now
        m.phases["inference"].labels(name).observe(finished - scheduled)
        if first_token is not None:
            m.phases["prefill"].labels(name).observe(first_token - scheduled)
            m.phases["decode"].labels(name).observe(finished - first_token)
            if num_generated > 1:
                tpot = (finished - first_token) / (num_generated - 1)
                m.request_tpot.labels(name).observe(tpot)
