"""HealthProbe: polls a server's /healthz from a process of its own and keeps how long
each answer took, for a bound on the slowest ones (``ProbeResult.percentile``).

A process, not a thread of the test: the test's own clients keep its interpreter busy
(a soak's 24 streams), and a thread there would wait for Python's lock, which would
count against the server. This module imports nothing heavy, as the probe process
imports it anew.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from dataclasses import dataclass

import httpx


@dataclass
class ProbeResult:
    latencies: list[float]  # seconds, one a probe, in order
    failures: list[str]  # answers other than 200

    @property
    def probes(self) -> int:
        return len(self.latencies)

    @property
    def max_latency(self) -> float:
        return max(self.latencies, default=0.0)

    def percentile(self, percent: float) -> float:
        """The latency ``percent`` % of the probes took at most (the nearest rank: one
        of the latencies, never an interpolation between two); 0 without probes."""
        if not 0 < percent <= 100:
            raise ValueError(f"percent must be in (0, 100], got {percent}")
        if not self.latencies:
            return 0.0
        rank = math.ceil(percent * len(self.latencies) / 100)
        return sorted(self.latencies)[rank - 1]


def _poll(url: str, period: float, started, stop, results) -> None:
    latencies, failures = [], []
    with httpx.Client(base_url=url, timeout=10) as http:
        http.get("/healthz")  # connects, so that no probe counts the connection's set-up
        started.set()
        while not stop.is_set():
            sent = time.perf_counter()
            response = http.get("/healthz")
            latencies.append(time.perf_counter() - sent)
            if response.status_code != 200:
                failures.append(f"{response.status_code} {response.text}")
            stop.wait(period)
    results.put(ProbeResult(latencies, failures))


class HealthProbe:
    """``with HealthProbe(url, period) as probe: ...``; then ``probe.result``."""

    def __init__(self, url: str, period: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._started = context.Event()
        self._stop = context.Event()
        self._results = context.Queue()
        args = (url, period, self._started, self._stop, self._results)
        self._process = context.Process(target=_poll, args=args, daemon=True)
        self.result: ProbeResult | None = None

    def __enter__(self) -> HealthProbe:
        """Returns once the probe polls."""
        self._process.start()
        if not self._started.wait(timeout=60):
            raise AssertionError("the /healthz probe did not start")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self.result = self._results.get(timeout=60)
        self._process.join(timeout=10)
