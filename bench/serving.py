"""Serving benchmark: streamed /v1/completions requests against any OpenAI-compatible
server, measuring what a client sees (in the manner of vLLM's ``benchmark_serving``).

    python -m bench.serving --base-url http://127.0.0.1:8000/v1 --model smollm2 \\
        --num-prompts 64 --concurrency 32 --prompt-len 256 --output-len 128 --label ours
    python -m bench.serving --compare bench/results/ours.json bench/results/llama-cpp.json

The tokenizer comes from ``--tokenizer`` (a folder, hub id or .gguf file), else from
``--model``; a benchmark model's name (``bench.models``: smollm2, ...) means its folder
(gemma-3-270m: its GGUF file's tokenizer).

Prompts are seeded random ordinary token ids of the model's tokenizer, decoded to
text (and re-encoded to about ``--prompt-len`` tokens). Requests arrive as a Poisson
process at ``--request-rate`` per second (``inf``: all at once), at most
``--concurrency`` in flight. Each is a streaming request with ``ignore_eos`` (a vLLM
extension; servers that do not honour it may stop early, so the tokens actually
received are counted) and ``stream_options.include_usage``; ``--workload`` says which:

- ``greedy``: ``/v1/completions`` with ``temperature=0``;
- ``chat``: what chat clients send: ``/v1/chat/completions`` with the prompt as the
  user's message, ``temperature=0.7``, ``top_p=0.95`` and a seed per request (the
  run's seed times 100,000 plus the request's index).

Per request: TTFT (until the first chunk with text), inter-token latencies (the gap
before each later chunk, split evenly over the tokens that chunk carries), TPOT
(``(e2e - ttft) / (output_tokens - 1)``), end-to-end latency, output tokens (the
server's usage when it sends one, else the text re-tokenized, and at least one per
chunk). ``--no-ignore-eos`` and ``--extra-body JSON`` adapt the requests to a server
with other switches (see bench/peers.py).

A run writes ``<out>/<label>.json`` (settings, summary, every request) and
``<out>/<label>.png`` (throughputs and latency distributions) and prints a table.
``--compare`` reads several such JSON files and writes one table (``.md``), JSON and
chart, with the ratio of the first run (or ``--baseline``) to each other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import httpx
import numpy as np

from bench.common import (
    RESULTS_DIR,
    align,
    column_widths,
    cpu_description,
    pyplot,
    resolve_model,
    save_figure,
)

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")
LATENCY_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E latency"}
# A byte-fallback piece of a SentencePiece vocabulary, such as <0xE2>.
BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# The flags that shape a run, which bench.serving and bench.peers share: BenchConfig's
# fields of the same names.
RUN_FLAGS = (
    "num_prompts",
    "prompt_len",
    "output_len",
    "request_rate",
    "concurrency",
    "seed",
    "warmup",
    "workload",
)
WORKLOADS = ("greedy", "chat")
# The chat workload's sampling (a seed per request is added).
CHAT_SAMPLING = {"temperature": 0.7, "top_p": 0.95}


# ---- settings and records ----


@dataclass
class BenchConfig:
    base_url: str
    model: str
    tokenizer: str | None = None  # a folder or hub id; defaults to ``model``
    num_prompts: int = 64
    prompt_len: int = 256
    output_len: int = 128
    request_rate: float = math.inf
    concurrency: int | None = None
    seed: int = 0
    ignore_eos: bool = True
    # Fields merged into every request body (a peer's own switches).
    extra_body: dict[str, Any] = field(default_factory=dict)
    warmup: int = 1
    workload: str = "greedy"  # WORKLOADS
    timeout: float = 3600.0
    api_key: str | None = None
    label: str = "run"

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> BenchConfig:
        """The run's shape from the command line (``RUN_FLAGS``), the server and its
        switches from ``fields``."""
        return cls(**{name: getattr(args, name) for name in RUN_FLAGS}, **fields)


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds."""

    index: int
    prompt_tokens: int
    max_tokens: int
    success: bool = False
    error: str = ""
    start: float = 0.0  # since the benchmark started
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    tokens_from_usage: bool = False
    chunks: int = 0  # chunks that carried text
    text: str = ""

    @property
    def tpot(self) -> float | None:
        return time_per_output_token(self.e2e, self.ttft, self.output_tokens)


# ---- metrics (pure functions, tested on made-up timings) ----


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation, as numpy's default; None
    for no values."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def time_per_output_token(
    e2e: float | None, ttft: float | None, output_tokens: int
) -> float | None:
    """Decode time per token after the first: undefined for fewer than two tokens."""
    if e2e is None or ttft is None or output_tokens < 2:
        return None
    return (e2e - ttft) / (output_tokens - 1)


def inter_token_latencies(
    chunk_times: Sequence[float], chunk_tokens: Sequence[int] | None = None
) -> list[float]:
    """Latencies between streamed chunks (times since the request was sent). A chunk
    that carries k tokens stands for k tokens that arrived together: its gap is split
    into k equal latencies, so that a server batching its stream is not credited with
    fewer, longer gaps than it took. The first chunk's tokens belong to the TTFT."""
    if chunk_tokens is None:
        chunk_tokens = [1] * len(chunk_times)
    latencies: list[float] = []
    for i in range(1, len(chunk_times)):
        k = max(1, chunk_tokens[i])
        latencies += [(chunk_times[i] - chunk_times[i - 1]) / k] * k
    return latencies


def chunk_token_counts(
    texts: Sequence[str], total_tokens: int, count_tokens: Callable[[str], int]
) -> list[int]:
    """How many of the ``total_tokens`` each text chunk carried. One each when the
    chunks and tokens are as many (the usual stream of one token per chunk). Otherwise
    (a server that batches its stream, or holds back tokens without text of their own)
    the total is shared out in proportion to each chunk's text re-tokenized, at least
    one each: an estimate, as a token's text may not survive the split."""
    n = len(texts)
    if n == total_tokens or n == 0 or total_tokens < n:
        return [1] * n
    weights = np.asarray([max(1, count_tokens(t)) for t in texts], dtype=np.float64)
    shares = weights / weights.sum() * total_tokens
    counts = np.maximum(1, np.floor(shares)).astype(np.int64)
    # Make them add up: give to the largest remainders, take from the smallest.
    order = np.argsort(-(shares - counts), kind="stable")
    i = 0
    while counts.sum() != total_tokens:
        j = order[i % n] if counts.sum() < total_tokens else order[n - 1 - i % n]
        if counts.sum() < total_tokens:
            counts[j] += 1
        elif counts[j] > 1:
            counts[j] -= 1
        i += 1
    return counts.tolist()


def latency_stats(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, std, median, p90 and p99 in milliseconds."""
    if len(values) == 0:
        return {"mean_ms": None, "std_ms": None, "p50_ms": None, "p90_ms": None, "p99_ms": None}
    ms = np.asarray(values, dtype=np.float64) * 1000.0
    return {
        "mean_ms": float(ms.mean()),
        "std_ms": float(ms.std()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


def summarize(records: Sequence[RequestRecord], duration: float) -> dict[str, Any]:
    """Throughputs over the whole run and latency statistics over completed requests."""
    done = [r for r in records if r.success]
    input_tokens = sum(r.prompt_tokens for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    summary: dict[str, Any] = {
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration_s": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration if duration > 0 else 0.0,
        "output_throughput": output_tokens / duration if duration > 0 else 0.0,
        "total_token_throughput": (input_tokens + output_tokens) / duration
        if duration > 0
        else 0.0,
        # Requests that stopped short of max_tokens (a server that ignores ignore_eos).
        "short_outputs": sum(1 for r in done if r.output_tokens < r.max_tokens),
    }
    series = {
        "ttft": [r.ttft for r in done if r.ttft is not None],
        "tpot": [t for r in done if (t := r.tpot) is not None],
        "itl": [x for r in done for x in r.itl],
        "e2e": [r.e2e for r in done if r.e2e is not None],
    }
    for name, values in series.items():
        summary[name] = latency_stats(values)
    errors = sorted({r.error for r in records if not r.success})
    summary["errors"] = errors[:10]
    return summary


# ---- prompts ----


def load_tokenizer(name: str) -> Any:
    """A tokenizer from a folder or hub id; a benchmark model's name (bench.models)
    means that model's folder, and a .gguf file (a GGUF benchmark model's, by name or
    path) the file's own tokenizer, as the engine converts it."""
    from transformers import AutoTokenizer

    from bench.models import BENCH_MODELS, gguf_tokenizer_folder, tokenizer_folder

    if name in BENCH_MODELS:
        return AutoTokenizer.from_pretrained(tokenizer_folder(name))
    if name.endswith(".gguf") and Path(name).is_file():
        return AutoTokenizer.from_pretrained(gguf_tokenizer_folder(Path(name)))
    return AutoTokenizer.from_pretrained(resolve_model(name))


def ordinary_token_ids(tokenizer: Any) -> np.ndarray:
    """Token ids that stand for text: not special or added tokens (control markers),
    nor a byte-fallback piece ``<0xAB>`` (alone, a byte of a character decodes to a
    replacement character, which re-encodes as three tokens)."""
    special = set(tokenizer.all_special_ids)
    special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    ids = sorted(
        i
        for piece, i in tokenizer.get_vocab().items()
        if i not in special and not BYTE_PIECE.fullmatch(piece)
    )
    return np.asarray(ids, dtype=np.int64)


def random_prompts(
    tokenizer: Any, num_prompts: int, prompt_len: int, seed: int
) -> list[tuple[str, int]]:
    """``num_prompts`` texts of about ``prompt_len`` tokens: random ordinary token ids,
    decoded. A decode does not always re-encode to as many tokens (pieces merge or
    split), so the ids are trimmed or topped up a few times, keeping the closest;
    returns (text, tokens)."""
    rng = np.random.default_rng(seed)
    vocab = ordinary_token_ids(tokenizer)
    prompts = []
    for _ in range(num_prompts):
        text = tokenizer.decode(rng.choice(vocab, size=prompt_len).tolist())
        best: tuple[str, int] | None = None
        for _attempt in range(8):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if best is None or abs(len(ids) - prompt_len) < abs(best[1] - prompt_len):
                best = (text, len(ids))
            if len(ids) == prompt_len:
                break
            if len(ids) > prompt_len:
                ids = ids[:prompt_len]
            else:
                ids += rng.choice(vocab, size=prompt_len - len(ids)).tolist()
            text = tokenizer.decode(ids)
        assert best is not None
        prompts.append(best)
    return prompts


# ---- the client ----


def request_route(config: BenchConfig) -> str:
    return "/chat/completions" if config.workload == "chat" else "/completions"


def _request_body(
    config: BenchConfig, prompt: str, max_tokens: int, index: int = 0
) -> dict[str, Any]:
    """A request's body; ``index`` (the request's) seeds a chat request's sampling."""
    body: dict[str, Any] = {
        "model": config.model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.workload == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        body |= CHAT_SAMPLING | {"seed": config.seed * 100_000 + index}
    else:
        body |= {"prompt": prompt, "temperature": 0.0}
    if config.ignore_eos:
        body["ignore_eos"] = True
    body.update(config.extra_body)
    return body


async def send_request(
    client: httpx.AsyncClient,
    config: BenchConfig,
    record: RequestRecord,
    prompt: str,
    count_tokens: Callable[[str], int],
    t0: float,
) -> RequestRecord:
    """Stream one completion and fill ``record`` in (never raises: a failure is
    recorded with its error)."""
    body = _request_body(config, prompt, record.max_tokens, record.index)
    texts: list[str] = []
    times: list[float] = []
    usage: dict[str, Any] | None = None
    sent = time.perf_counter()
    record.start = sent - t0
    try:
        async with client.stream("POST", request_route(config), json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:300]
                raise RuntimeError(f"HTTP {response.status_code}: {detail}")
            event = "message"
            async for line in response.aiter_lines():
                if not line:
                    event = "message"  # a blank line ends an SSE event
                    continue
                if line.startswith("event:"):
                    event = line[6:].strip()
                    continue
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if event == "error" or "error" in chunk:
                    raise RuntimeError(f"stream error: {json.dumps(chunk)[:300]}")
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    if text:
                        # Stamp on arrival: the decode of later lines must not count.
                        times.append(time.perf_counter() - sent)
                        texts.append(text)
        record.e2e = time.perf_counter() - sent
    except Exception as exc:  # noqa: BLE001 - any failure is the request's result
        record.error = f"{type(exc).__name__}: {exc}"[:500]
        return record
    record.text = "".join(texts)
    record.chunks = len(texts)
    if usage and usage.get("completion_tokens") is not None:
        record.output_tokens = int(usage["completion_tokens"])
        record.tokens_from_usage = True
    else:
        # Without usage: the text re-tokenized, an estimate (random-ish text need not
        # encode back to the tokens it came from), but no fewer than the chunks, as
        # each carried at least one token.
        record.output_tokens = max(count_tokens(record.text), len(texts))
    if not texts:
        record.error = "no text received"
        return record
    record.ttft = times[0]
    record.itl = inter_token_latencies(
        times, chunk_token_counts(texts, record.output_tokens, count_tokens)
    )
    record.success = True
    return record


def _arrival_gaps(n: int, rate: float, seed: int) -> list[float]:
    """Seconds to wait before each request: a Poisson process (exponential gaps), or
    no waiting at an infinite rate."""
    if math.isinf(rate) or rate <= 0:
        return [0.0] * n
    rng = np.random.default_rng(seed + 1)  # not the prompts' stream
    gaps = rng.exponential(1.0 / rate, size=n).tolist()
    return [0.0, *gaps[1:]]  # the clock starts with the first arrival


def _make_client(config: BenchConfig, connections: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    return httpx.AsyncClient(
        base_url=config.base_url.rstrip("/"),
        headers=headers,
        timeout=httpx.Timeout(config.timeout, connect=60.0),
        # Above the concurrency so the pool never queues what the semaphore let through.
        limits=httpx.Limits(max_connections=connections + 8, max_keepalive_connections=connections),
    )


async def run_benchmark_async(
    config: BenchConfig,
    tokenizer: Any,
    prompts: list[tuple[str, int]],
    warmup_prompts: Sequence[tuple[str, int]] = (),
) -> tuple[list[RequestRecord], float]:
    """Send the prompts as configured, after the warm-up prompts (not measured); returns
    the records and the run's duration."""

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    in_flight = config.concurrency or len(prompts)
    async with _make_client(config, in_flight) as client:
        if warmup_prompts:
            # Not measured: first requests pay for lazy start-up (graph capture, a
            # peer's batching manager), which is not what the run is about. Prompts of
            # their own, so that no prefix cache holds a measured prompt beforehand.
            t_w = time.perf_counter()
            warm = [
                RequestRecord(i, n, min(config.output_len, 8))
                for i, (_, n) in enumerate(warmup_prompts)
            ]
            await asyncio.gather(
                *(
                    send_request(client, config, r, warmup_prompts[r.index][0], count_tokens, t_w)
                    for r in warm
                )
            )
            failed = [r.error for r in warm if not r.success]
            if failed:
                raise RuntimeError(f"warm-up request failed: {failed[0]}")

        semaphore = asyncio.Semaphore(in_flight)
        records = [RequestRecord(i, n, config.output_len) for i, (_, n) in enumerate(prompts)]
        t0 = time.perf_counter()

        async def limited(record: RequestRecord) -> RequestRecord:
            async with semaphore:
                return await send_request(
                    client, config, record, prompts[record.index][0], count_tokens, t0
                )

        tasks = []
        for record, gap in zip(
            records, _arrival_gaps(len(prompts), config.request_rate, config.seed), strict=True
        ):
            if gap > 0:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(limited(record)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    return records, duration


def benchmark(config: BenchConfig, tokenizer: Any | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the result (settings, summary, requests) as a dict."""
    tokenizer = tokenizer or load_tokenizer(config.tokenizer or config.model)
    # The measured prompts come first from the seeded stream: the same whatever the
    # number of warm-up prompts drawn after them.
    drawn = random_prompts(
        tokenizer, config.num_prompts + config.warmup, config.prompt_len, config.seed
    )
    prompts, warmup = drawn[: config.num_prompts], drawn[config.num_prompts :]
    records, duration = asyncio.run(run_benchmark_async(config, tokenizer, prompts, warmup))
    settings = asdict(config)
    settings.pop("api_key", None)
    settings["request_rate"] = "inf" if math.isinf(config.request_rate) else config.request_rate
    return {
        "label": config.label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            **cpu_description(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "settings": settings,
        "summary": summarize(records, duration),
        "requests": [{**asdict(r), "tpot": r.tpot} for r in records],
    }


# ---- reports ----


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(key, title, value) for every number of a summary, in table order."""
    rows: list[tuple[str, str, Any]] = [
        ("completed", "completed requests", summary["completed"]),
        ("failed", "failed requests", summary["failed"]),
        ("duration_s", "duration (s)", summary["duration_s"]),
        ("total_input_tokens", "input tokens", summary["total_input_tokens"]),
        ("total_output_tokens", "output tokens", summary["total_output_tokens"]),
        ("request_throughput", "requests/s", summary["request_throughput"]),
        ("output_throughput", "output tokens/s", summary["output_throughput"]),
        ("total_token_throughput", "total tokens/s", summary["total_token_throughput"]),
    ]
    for metric in LATENCY_METRICS:
        for stat in ("mean", "p50", "p99"):
            key = f"{metric}.{stat}_ms"
            rows.append(
                (key, f"{LATENCY_NAMES[metric]} {stat} (ms)", summary[metric][f"{stat}_ms"])
            )
    return rows


def format_summary(result: dict[str, Any]) -> str:
    summary = result["summary"]
    s = result["settings"]
    lines = [
        f"== {result['label']}: {s['num_prompts']} prompts x {s['prompt_len']} tokens -> "
        f"{s['output_len']} tokens, rate {s['request_rate']}, concurrency {s['concurrency']} ==",
    ]
    width = max(len(title) for _, title, _ in summary_rows(summary))
    for _, title, value in summary_rows(summary):
        lines.append(f"{title:<{width}}  {_fmt(value):>12}")
    if summary["short_outputs"]:
        lines.append(f"note: {summary['short_outputs']} requests ended before max_tokens")
    for error in summary["errors"]:
        lines.append(f"error: {error}")
    return "\n".join(lines)


def _get(summary: dict[str, Any], key: str) -> Any:
    value: Any = summary
    for part in key.split("."):
        value = value[part]
    return value


def compare(results: Sequence[dict[str, Any]], baseline: str | None = None) -> dict[str, Any]:
    """One table of several runs: each row a metric, each run a column, and the ratio
    of the baseline run to each other run (for throughputs above 1 means the baseline
    is faster; for latencies below 1 means it is faster)."""
    labels = [r["label"] for r in results]
    if len(set(labels)) != len(labels):
        raise ValueError(f"runs to compare need distinct labels, got {labels}")
    base = baseline or labels[0]
    if base not in labels:
        raise ValueError(f"baseline {base!r} is not among {labels}")
    by_label = {r["label"]: r for r in results}
    rows = []
    for key, title, _ in summary_rows(results[0]["summary"]):
        values = {label: _get(by_label[label]["summary"], key) for label in labels}
        ratios = {}
        for label in labels:
            if label == base:
                continue
            mine, theirs = values[base], values[label]
            ratios[label] = mine / theirs if mine is not None and theirs else None
        rows.append({"key": key, "title": title, "values": values, "ratios": ratios})
    return {
        "baseline": base,
        "labels": labels,
        "settings": {label: by_label[label]["settings"] for label in labels},
        # Where each run was measured (its CPU and flags, where its record has them).
        "hosts": {label: by_label[label].get("host") for label in labels},
        "rows": rows,
    }


def format_comparison(comparison: dict[str, Any]) -> str:
    labels = comparison["labels"]
    base = comparison["baseline"]
    others = [label for label in labels if label != base]
    head = ["metric", *labels, *(f"{base}/{o}" for o in others)]
    body = []
    for row in comparison["rows"]:
        cells = [row["title"], *(_fmt(row["values"][label]) for label in labels)]
        cells += [_fmt(row["ratios"][o], 3) for o in others]
        body.append(cells)
    widths = column_widths([head, *body])

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    # A Markdown table: the header all to the left, the numbers to the right.
    lines = [line(align(head, widths, left=len(head))), line(["-" * w for w in widths])]
    lines += [line(align(cells, widths)) for cells in body]
    lines.append(f"ratios {base}/peer: above 1 is better for throughputs, below 1 for latencies")
    return "\n".join(lines)


def _latency_series(result: dict[str, Any], metric: str) -> list[float]:
    done = [r for r in result["requests"] if r["success"]]
    if metric == "itl":
        return [x * 1000 for r in done for x in r["itl"]]
    return [r[metric] * 1000 for r in done if r[metric] is not None]


def plot(results: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Throughput bars and latency box plots of one or more runs, side by side."""
    plt = pyplot()
    labels = [r["label"] for r in results]
    colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(labels))]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    bars = [
        ("output_throughput", "output tokens/s (higher is better)"),
        ("request_throughput", "requests/s (higher is better)"),
    ]
    for ax, (key, name) in zip(axes[0][:2], bars, strict=True):
        values = [r["summary"][key] for r in results]
        drawn = ax.bar(labels, values, color=colors)
        ax.bar_label(drawn, fmt="%.1f" if key == "output_throughput" else "%.2f")
        ax.set_title(name)
        ax.margins(y=0.15)
    for ax, metric in zip([axes[0][2], *axes[1]], LATENCY_METRICS, strict=True):
        series = [_latency_series(r, metric) for r in results]
        # A run with no values (all failed) still gets its slot on the axis.
        box = ax.boxplot(
            [s if s else [math.nan] for s in series],
            tick_labels=labels,
            showfliers=metric != "itl",
            whis=(1, 99),
            patch_artist=True,
        )
        for patch, color in zip(box["boxes"], colors, strict=True):
            patch.set_facecolor(color)
            patch.set_alpha(0.5)
        means = [float(np.mean(s)) if s else math.nan for s in series]
        ax.plot(range(1, len(labels) + 1), means, "k^", label="mean")
        finite = [m for m in means if m > 0]
        if finite and max(finite) / min(finite) > 8:
            ax.set_yscale("log")  # peers an order of magnitude apart stay readable
        ax.set_title(f"{LATENCY_NAMES[metric]} (ms; whiskers p1-p99)")
        ax.legend(loc="upper right", fontsize="small")
    s = results[0]["settings"]
    fig.suptitle(
        title
        or f"{s['num_prompts']} prompts x {s['prompt_len']} tokens -> {s['output_len']} tokens, "
        f"rate {s['request_rate']}, concurrency {s['concurrency']}"
    )
    return save_figure(fig, path, dpi=100)


def write_result(result: dict[str, Any], out: Path, name: str | None = None) -> tuple[Path, Path]:
    """``<name>.json`` (everything) and ``<name>.png`` (its chart) in ``out``; the name
    is the run's label unless given."""
    name = name or result["label"]
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{name}.json"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    return json_path, plot([result], out / f"{name}.png")


def write_comparison(
    results: Sequence[dict[str, Any]],
    out: Path,
    name: str = "comparison",
    baseline: str | None = None,
) -> tuple[str, list[Path]]:
    """The comparison table (returned), and ``<name>.json`` / ``.md`` / ``.png``."""
    comparison = compare(results, baseline)
    table = format_comparison(comparison)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md", out / f"{name}.png"]
    paths[0].write_text(json.dumps(comparison, indent=1) + "\n")
    paths[1].write_text(table + "\n")
    plot(results, paths[2])
    return table, paths


# ---- command line ----


def _rate(text: str) -> float:
    return math.inf if text.lower() in ("inf", "infinity") else float(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", help="the model name requests carry")
    parser.add_argument("--tokenizer", help="tokenizer folder or id (default: --model)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--request-rate", type=_rate, default=math.inf, help="per second, or inf")
    parser.add_argument("--concurrency", type=int, help="most requests in flight")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-ignore-eos", action="store_true", help="leave ignore_eos out of requests"
    )
    parser.add_argument("--extra-body", default="{}", help="JSON merged into each request")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured requests first")
    parser.add_argument("--workload", choices=WORKLOADS, default="greedy")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per request, seconds")
    parser.add_argument("--api-key")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--label", default="ours")
    parser.add_argument(
        "--compare", nargs="+", type=Path, metavar="JSON", help="compare finished runs instead"
    )
    parser.add_argument("--baseline", help="label the ratios are taken of (default: first)")
    parser.add_argument("--name", default="comparison", help="file name of a comparison")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.compare:
        results = [json.loads(p.read_text()) for p in args.compare]
        table, paths = write_comparison(results, args.out, args.name, args.baseline)
        print(table)
        print("wrote " + ", ".join(str(p) for p in paths))
        return 0
    if not args.model:
        print("error: --model is required (or --compare)", file=sys.stderr)
        return 2
    config = BenchConfig.from_args(
        args,
        base_url=args.base_url,
        model=args.model,
        tokenizer=args.tokenizer,
        ignore_eos=not args.no_ignore_eos,
        extra_body=json.loads(args.extra_body),
        timeout=args.timeout,
        api_key=args.api_key,
        label=args.label,
    )
    result = benchmark(config)
    print(format_summary(result))
    paths = write_result(result, args.out)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0 if result["summary"]["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
