"""A soak: a few hundred mixed requests, many at once, against a server process on the
tiny model, with clients that leave mid-way and a few bad requests among them.

The mix: completions and chat, whole and streamed, n up to 3, stop strings, JSON mode
(response_format json_schema), usage in streams. About 30% of the clients go away at a
random point (mid-stream, or before a whole answer comes); about 5% send a request the
server must refuse (a prompt over the context, a temperature out of range).

Afterwards: every request that stayed got a whole, well-formed answer (each choice
finished, stop strings cut, JSON mode's output valid, greedy answers the exact text the
engine gives alone), every bad one a 400 in OpenAI's shape, no 5xx; nothing runs or
waits and no KV block is in use; the process's memory grew by no more than a bound after
the warm-up (the same mix, as many choices as the soak's, then one-token answers that
fill the engine's store of finished outputs); and throughout, 99% of the /healthz probes
were answered within 200 ms, as nothing holds the event loop up again and again: not
the steps, nor the garbage collector.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from hetero_infer.engine.entrypoints.llm_engine import LLMEngine
from hetero_infer.engine.frontend.output_processor import MAX_FINISHED_KEPT
from hetero_infer.engine.params.sampling_params import SamplingParams

from tests.engine.test_json_schema import SMALL
from tests.server.conftest import MAX_MODEL_LEN, MODEL_NAME, wait_until
from tests.server.gauges import gauges, is_idle
from tests.server.health_probe import HealthProbe, ProbeResult
from tests.server.openai_shapes import check_error_body, parse_stream
from tests.server.stable_prompts import STABLE_MAX_TOKENS, STABLE_PROMPTS

SEED = 1125
NUM_REQUESTS = 600
CONCURRENCY = 24
DISCONNECT_SHARE = 0.3
BAD_SHARE = 0.05
HEALTH_PERIOD = 0.05
# The 99th percentile of the probes' latencies is bounded, not the slowest: a probe
# waits for a core whenever the soak's clients, the server and the machine's other work
# take both, and then the slowest few took 240-700 ms while the 99th percentile took
# 90-125 ms (the median 20-30). A server whose event loop is held up again and again
# crosses it: a step's work done on the loop, or full collections of the startup heap
# (which the server freezes once ready: 200-430 ms each, several a minute). One stall
# alone no longer fails the soak. The soak sends 200-300 probes (one every HEALTH_PERIOD
# and its answer's time; 220-290 seen): the 99th percentile is then the third slowest,
# so two stalls pass and three do not.
HEALTH_PERCENTILE = 99
HEALTH_LIMIT = 0.2
# The server's resident memory may grow this much from after the warm-up to the end.
# The warm-up is the same mix, at least as many choices as the soak's (and
# WARMUP_SPARE_CHOICES more), then short answers that fill the engine's store of recent
# finished outputs (LLMEngine.get_output: the last MAX_FINISHED_KEPT choices), oldest
# first out: the soak's outputs only replace the warm-up's mix, ones of the same kind;
# and the engine's buffers, the grammar compiler, torch's and the allocators' pools are
# at their working size. What is left is allocator noise, 0-1 MiB seen. A leak of what a
# request holds crosses it from about 27 KiB a request (16 MiB over 600); a smaller one
# may not: keeping every output of every request (about 15 KiB a request) grew it by
# 7-9 MiB.
RSS_GROWTH_LIMIT_MIB = 16
# Mix choices beyond the soak's in the warm-up, for those that never reach the store (a
# client that leaves before its request reaches the engine adds none); the filler
# pushes the rest out.
WARMUP_SPARE_CHOICES = 64
# The filler: answers of one token, this many choices a request, this many requests at
# once: no more sequences in flight than the mix has (24 requests of up to 3 choices).
# Larger batches (128 choices, 24 at once) raised the resident size by 23 MiB that the
# soak's allocations then reused, hiding growth: a planted leak of every output a
# request gets grew it by 2 MiB instead of 7.
FILLER_CHOICES_PER_REQUEST = 16
FILLER_CONCURRENCY = 4
CHAT_MESSAGES = [
    [{"role": "user", "content": "Hello there, is it working?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}],
]
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "small", "schema": SMALL}}


@dataclass
class Job:
    """One request of the soak, and how its client behaves."""

    path: str
    body: dict[str, Any]
    bad: bool = False  # the server must refuse it with a 400
    # Whether the client leaves: after this many SSE events, or (a whole answer) after
    # this many seconds.
    leave_after_events: int | None = None
    leave_after_seconds: float | None = None
    # A greedy completion of a stable prompt: the exact text it must get.
    expected_text: str | None = None

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def stops(self) -> list[str]:
        stop = self.body.get("stop") or []
        return [stop] if isinstance(stop, str) else stop


def choices_of(jobs: list[Job]) -> int:
    """The choices the engine runs for ``jobs`` (the bad ones it never sees)."""
    return sum(job.body.get("n", 1) for job in jobs if not job.bad)


def filler_jobs(num_choices: int) -> list[Job]:
    """Whole answers of one token and many choices each, ``num_choices`` in all: the
    cheapest way to fill the engine's store of finished outputs."""
    jobs = []
    while num_choices > 0:
        n = min(num_choices, FILLER_CHOICES_PER_REQUEST)
        body = {"prompt": "Fill", "max_tokens": 1, "n": n, "ignore_eos": True}
        jobs.append(Job("/v1/completions", body))
        num_choices -= n
    return jobs


@dataclass
class Figures:
    outcomes: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    stopped_by_string: int = 0


class JobMaker:
    """Draws the soak's jobs from a seeded random source, so every run sends the same."""

    def __init__(self, reference: dict[str, str], seed: int) -> None:
        self.reference = reference  # stable prompt -> its greedy text alone
        self.rng = random.Random(seed)

    def make(self, count: int) -> list[Job]:
        return [self._job() for _ in range(count)]

    def make_choices(self, num_choices: int) -> list[Job]:
        """Jobs that ask for at least ``num_choices`` choices in all."""
        jobs: list[Job] = []
        while choices_of(jobs) < num_choices:
            jobs.append(self._job())
        return jobs

    def _job(self) -> Job:
        rng = self.rng
        if rng.random() < BAD_SHARE:
            return self._bad()
        kind = rng.choice(["greedy", "completion", "chat", "json"])
        job = getattr(self, f"_{kind}")()
        job.body["stream"] = rng.random() < 0.5
        if job.stream and rng.random() < 0.5:
            job.body["stream_options"] = {"include_usage": True}
        if rng.random() < DISCONNECT_SHARE:
            if job.stream:
                job.leave_after_events = rng.randint(0, 12)
            else:
                job.leave_after_seconds = rng.uniform(0.0, 0.5)
        return job

    def _greedy(self) -> Job:
        """A stable prompt, greedy, cut by a stop string taken from its own answer."""
        prompt = self.rng.choice(STABLE_PROMPTS)
        full = self.reference[prompt]
        # Three characters from past its start, none a replacement character (a stop
        # string is looked for in whole characters only).
        starts = [i for i in range(2, len(full) - 3) if "\ufffd" not in full[i : i + 3]]
        start = self.rng.choice(starts)
        stop = full[start : start + 3]
        body = {"prompt": prompt, "max_tokens": STABLE_MAX_TOKENS, "temperature": 0}
        body |= {"stop": [stop], "ignore_eos": True}
        return Job("/v1/completions", body, expected_text=full[: full.find(stop)])

    def _completion(self) -> Job:
        body = self._sampled(prompt=f"Tell me about soak test {self.rng.randint(0, 999)}")
        return Job("/v1/completions", body)

    def _chat(self) -> Job:
        return Job("/v1/chat/completions", self._sampled(messages=self.rng.choice(CHAT_MESSAGES)))

    def _json(self) -> Job:
        body = self._sampled(messages=self.rng.choice(CHAT_MESSAGES), response_format=JSON_FORMAT)
        body["max_tokens"] = 200  # SMALL's longest answer fits, with room to spare
        body.pop("stop")  # a stop string could cut the JSON short
        return Job("/v1/chat/completions", body)

    def _sampled(self, **fields: Any) -> dict[str, Any]:
        rng = self.rng
        return {
            **fields,
            "max_tokens": rng.randint(4, 40),
            "n": rng.choice([1, 1, 2, 3]),
            "temperature": rng.choice([0.0, 0.7, 1.0]),
            "seed": rng.randint(0, 2**31),
            "stop": rng.sample(["e", "a", " t", "o", "\n"], k=rng.randint(0, 2)),
        }

    def _bad(self) -> Job:
        if self.rng.random() < 0.5:
            body = {"prompt": "a " * (MAX_MODEL_LEN + 10), "max_tokens": 4}
        else:
            body = {"prompt": "Hello", "temperature": 5.0}
        return Job("/v1/completions", body, bad=True)


async def run_job(http: httpx.AsyncClient, job: Job, figures: Figures) -> None:
    body = {"model": MODEL_NAME, **job.body}
    if job.leave_after_seconds is not None:
        try:
            response = await asyncio.wait_for(
                http.post(job.path, json=body), timeout=job.leave_after_seconds
            )
        except TimeoutError:  # the client left; httpx closed the connection
            figures.outcomes["left before the answer"] += 1
            return
        check_answer(job, response.status_code, response.text, figures)
        return
    if not job.stream:
        response = await http.post(job.path, json=body)
        check_answer(job, response.status_code, response.text, figures)
        return
    async with http.stream("POST", job.path, json=body) as response:
        # Raw text, split on the blank lines between events: a model's text may hold
        # characters that httpx's line splitting would take for line ends.
        text = ""
        async for piece in response.aiter_text():
            text += piece
            if leaves_now(job, text):
                figures.outcomes["left mid-stream"] += 1
                return  # leaving the block closes the connection
    check_answer(job, response.status_code, text, figures)


def leaves_now(job: Job, text: str) -> bool:
    """Whether a streaming client that has read ``text`` leaves now (before the end)."""
    if job.leave_after_events is None or "data: [DONE]" in text:
        return False
    return text.count("\n\n") >= job.leave_after_events


def check_answer(job: Job, status: int, text: str, figures: Figures) -> None:
    figures.statuses[status] += 1
    if job.bad:
        assert status == 400, text
        check_error_body(json.loads(text))
        figures.outcomes["refused"] += 1
        return
    assert status == 200, text
    if job.stream:
        stream = parse_stream(text)
        assert not stream.errors, stream.errors
        texts, finish_reasons, stop_reasons = _stream_choices(job, stream.chunks)
        if job.body.get("stream_options"):
            usage = stream.chunks[-1]["usage"]
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    else:
        answer = json.loads(text)
        texts, finish_reasons, stop_reasons = _whole_choices(job, answer)
        if len(texts) == 1 and finish_reasons[0] == "length":
            assert answer["usage"]["completion_tokens"] == job.body["max_tokens"], answer
    assert len(texts) == job.body.get("n", 1)
    for choice_text, finish_reason, stop_reason in zip(
        texts, finish_reasons, stop_reasons, strict=True
    ):
        assert finish_reason in ("stop", "length"), finish_reason
        for stop in job.stops:
            assert stop not in choice_text, (stop, choice_text)
        if isinstance(stop_reason, str):
            assert finish_reason == "stop" and stop_reason in job.stops
            figures.stopped_by_string += 1
        if "response_format" in job.body:
            assert finish_reason == "stop", choice_text
            jsonschema.validate(json.loads(choice_text), SMALL)
        if job.expected_text is not None:
            assert choice_text == job.expected_text
    figures.outcomes["completed"] += 1


def _whole_choices(job: Job, answer: dict[str, Any]) -> tuple[list, list, list]:
    choices = sorted(answer["choices"], key=lambda c: c["index"])
    if job.path == "/v1/chat/completions":
        texts = [c["message"]["content"] for c in choices]
    else:
        texts = [c["text"] for c in choices]
    return texts, [c["finish_reason"] for c in choices], [c["stop_reason"] for c in choices]


def _stream_choices(job: Job, chunks: list[dict[str, Any]]) -> tuple[list, list, list]:
    """Per choice index: its text joined, and its finish and stop reasons (from its one
    finishing chunk)."""
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    stop: dict[int, Any] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            index = choice["index"]
            assert index not in finish, f"choice {index} went on after finishing"
            if job.path == "/v1/chat/completions":
                piece = choice["delta"].get("content") or ""
            else:
                piece = choice["text"]
            texts[index] = texts.get(index, "") + piece
            if choice["finish_reason"] is not None:
                finish[index] = choice["finish_reason"]
                stop[index] = choice.get("stop_reason")
    assert set(finish) == set(texts), "a choice never finished"
    order = sorted(texts)
    return [texts[i] for i in order], [finish[i] for i in order], [stop[i] for i in order]


def resident_mib(pid: int) -> float:
    """The process's resident set size (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


async def run_jobs(
    url: str, jobs: list[Job], figures: Figures, concurrency: int = CONCURRENCY
) -> None:
    limits = httpx.Limits(max_connections=concurrency + 4)
    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:

        async def one(job: Job) -> None:
            async with slots:
                await run_job(http, job, figures)

        await asyncio.gather(*(one(job) for job in jobs))


def greedy_texts(engine: LLMEngine) -> dict[str, str]:
    params = SamplingParams(max_tokens=STABLE_MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = engine.generate(STABLE_PROMPTS, params, use_tqdm=False)
    return {prompt: out.text for prompt, out in zip(STABLE_PROMPTS, outputs, strict=True)}


def test_health_percentile_bounds_all_but_the_slowest_probes():
    """The soak's bound on /healthz: one stall among a hundred probes passes it, as the
    slowest probe does not count; two do not, nor a slow median."""
    fast = [0.002 + 0.0001 * i for i in range(98)]
    one_stall = ProbeResult([0.4, *fast, 0.05], [])
    assert one_stall.percentile(HEALTH_PERCENTILE) == 0.05 < HEALTH_LIMIT
    assert one_stall.percentile(100) == one_stall.max_latency == 0.4
    assert one_stall.percentile(50) == fast[49]  # the 50th of 100
    two_stalls = ProbeResult([0.4, *fast, 0.3], [])
    assert two_stalls.percentile(HEALTH_PERCENTILE) == 0.3 > HEALTH_LIMIT
    assert ProbeResult([0.25] * 100, []).percentile(HEALTH_PERCENTILE) > HEALTH_LIMIT
    assert ProbeResult([], []).percentile(HEALTH_PERCENTILE) == 0.0
    with pytest.raises(ValueError, match="percent"):
        one_stall.percentile(0)


@pytest.mark.slow
def test_soak(server_process_factory, reference_engine: LLMEngine, monkeypatch):
    # The tiny fp32 model's matmuls go through oneDNN, which keeps a compiled primitive
    # per matmul shape it meets (1,024 of them by default): the soak's mixes of prompt
    # lengths and batch sizes meet new shapes long after the warm-up, and that bounded
    # cache grew the server by up to 100 MiB, 5-20 MiB of it during the soak. It is not
    # what this test watches (what requests hold), so the server runs without it.
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")
    proc = server_process_factory()
    proc.wait_ready()
    maker = JobMaker(greedy_texts(reference_engine), SEED)
    pid = proc.process.pid
    figures = Figures()
    rss_start = resident_mib(pid)
    jobs = maker.make(NUM_REQUESTS)
    warmup = maker.make_choices(choices_of(jobs) + WARMUP_SPARE_CHOICES)
    filler = filler_jobs(MAX_FINISHED_KEPT - choices_of(jobs))
    asyncio.run(run_jobs(proc.url, warmup, Figures()))
    # The filler after the mix, so that the mix's outputs are the store's oldest.
    with httpx.Client(base_url=proc.url, timeout=30) as http:
        wait_until(lambda: is_idle(http), 10, "the server to be idle after the warm-up")
    asyncio.run(run_jobs(proc.url, filler, Figures(), FILLER_CONCURRENCY))
    rss_warm = resident_mib(pid)
    started = time.monotonic()
    with HealthProbe(proc.url, HEALTH_PERIOD) as probe:
        asyncio.run(run_jobs(proc.url, jobs, figures))
    health = probe.result
    assert health is not None
    elapsed = time.monotonic() - started
    with httpx.Client(base_url=proc.url, timeout=30) as http:
        wait_until(lambda: is_idle(http), 10, "the server to be idle after the soak")
        final = gauges(http)
    rss_end = resident_mib(pid)
    slowest_ms = [round(seconds * 1000) for seconds in sorted(health.latencies)[-3:]]
    print(
        f"\nsoak: {len(warmup)} warm-up requests ({choices_of(warmup)} choices) and "
        f"{len(filler)} of {choices_of(filler)} short choices, then {len(jobs)} "
        f"({choices_of(jobs)} choices) in {elapsed:.1f} s, "
        f"{dict(figures.outcomes)}, "
        f"statuses {dict(figures.statuses)}, {figures.stopped_by_string} choices cut by a "
        f"stop string; /healthz {health.probes} probes, median "
        f"{health.percentile(50) * 1000:.0f} ms, p{HEALTH_PERCENTILE} "
        f"{health.percentile(HEALTH_PERCENTILE) * 1000:.0f} ms, slowest (ms) "
        f"{slowest_ms}; RSS {rss_start:.0f} MiB at start, "
        f"{rss_warm:.0f} after the warm-up, {rss_end:.0f} at the end; gauges {final}"
    )
    outcomes = figures.outcomes
    assert sum(outcomes.values()) == len(jobs)
    assert outcomes["left mid-stream"] + outcomes["left before the answer"] > 0.15 * len(jobs)
    assert outcomes["refused"] == sum(job.bad for job in jobs) > 0
    assert not any(status >= 500 for status in figures.statuses)
    assert figures.stopped_by_string > 0, "no stop string ever cut an answer"
    assert not health.failures, health.failures
    # Before the probes' count: a loop held up slows the probe down too.
    assert health.percentile(HEALTH_PERCENTILE) < HEALTH_LIMIT
    # One probe per period at least half the time: the probe ran all through the soak.
    assert health.probes > 0.5 * elapsed / HEALTH_PERIOD
    assert rss_end - rss_warm < RSS_GROWTH_LIMIT_MIB
