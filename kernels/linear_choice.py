"""Which kernel runs a bf16 projection on this CPU, by the rows of a call: chosen by
timing the candidates on the model's own weights, on the machine it runs on.

Two kernels take a bf16 weight (kernels/linear_cpu.py): ours, on AVX-512 panels or on
AMX's tiles where it runs on them (kernels/csrc/linear_amx.cpp), and oneDNN's, which
uses AMX's tiles where the CPU has them. Which is faster depends on the CPU and the
rows: on AMD EPYCs ours wins at every row count (1.1-2x); on an Emerald Rapids Xeon ours
on AVX-512 won 1.8x at one row and oneDNN 3-6x from 16 rows on, its tiles, and ours on
the tiles takes 0.5-0.9x oneDNN's time up to 256 rows. So each projection shape is
timed at one row count per bucket of rows (ROW_BUCKETS), over enough copies of its
weight that they stream from memory as a step reads them, and each bucket gets its
winner. oneDNN replaces ours only where it is ONEDNN_MARGIN faster: a near tie keeps
the incumbent, so the numerics do not follow the noise of a measurement.

Modes (EngineConfig.cpu_linear_kernel): "kernel" (the default) and "onednn" run one
kernel wherever it takes the weight; "measure" times each shape once per machine, the
choice kept in this process and in CACHE_PATH, a JSON file keyed by the CPU, its flags,
the threads and the library versions, so that a later start reads it; "rule" takes
RULE's choice without timing. One kernel at every row count is the default because it
keeps a request's results independent of the batch it runs in (n choices equal lone
requests, seeded sampling whatever the batch: the engine's tests hold it to that); a
choice split by rows gives that up, in bf16, for speed where oneDNN wins the larger rows.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hetero_infer.kernels import cpu_build, cpu_isa
from hetero_infer.kernels.linear import LinearFn

logger = logging.getLogger(__name__)

KERNEL, ONEDNN = "kernel", "onednn"
MODES = ("measure", "rule", KERNEL, ONEDNN)
# A call's rows -> its bucket: rows <= ROW_BUCKETS[i] is bucket i, more the last one.
ROW_BUCKETS = (1, 8, 32, 128)
# The rows each bucket is timed at (about its middle, on a log scale).
TIMED_ROWS = (1, 4, 16, 64, 256)
BUCKET_NAMES = ("1", "2-8", "9-32", "33-128", "129+")
ONEDNN_MARGIN = 1.1
# The weight copies a timing streams through: more than a server CPU's last-level cache
# holds for one core's share, so that one row is bound by memory as in a step.
STREAM_BYTES = 64 * 1024**2
MAX_COPIES = 8
# Passes over the copies per candidate and row count, the two candidates alternating (so
# that a drift of the machine's speed falls on both), after one of each to warm up.
TIMED_PAIRS = 5
CACHE_PATH = Path.home() / ".cache" / "hetero-infer" / "cpu-linear-choice.json"

# Without time to measure: ours everywhere, but on a CPU with AMX where ours does not run
# on the tiles (not built for them, refused them, or cpu_amx off), oneDNN's tiles from a
# few rows on (the Emerald Rapids figures above).
RULE_WITH_AMX = (KERNEL, ONEDNN, ONEDNN, ONEDNN, ONEDNN)
RULE = (KERNEL,) * len(TIMED_ROWS)

# (candidate, rows) -> seconds per call: how a choice is timed (a test's fake gives its own)
Timer = Callable[[str, int], float]


def row_bucket(rows: int) -> int:
    return bisect.bisect_left(ROW_BUCKETS, rows)


@dataclass(frozen=True)
class ShapeChoice:
    """A projection shape's kernel per row bucket, and how it was decided."""

    kernels: tuple[str, ...]  # per bucket of ROW_BUCKETS
    source: str  # "measured", "cached", "rule" or "forced"
    # per bucket, (ours, oneDNN's) seconds a call, where measured
    seconds: tuple[tuple[float, float], ...] = ()

    def kernel_for(self, rows: int) -> str:
        return self.kernels[row_bucket(rows)]


def pick(seconds: tuple[tuple[float, float], ...]) -> tuple[str, ...]:
    """Each bucket's kernel from its (ours, oneDNN's) timings."""
    return tuple(ONEDNN if ours > onednn * ONEDNN_MARGIN else KERNEL for ours, onednn in seconds)


def machine_key(flags: frozenset[str]) -> str:
    """What a measured choice holds for: the CPU, its vector and matrix ``flags``, the
    torch threads and the torch and kernel builds."""
    return "|".join(
        [
            cpu_isa.cpu_model() or "unknown CPU",
            ",".join(sorted(flags)),
            f"threads={torch.get_num_threads()}",
            torch.__version__,
            str(torch.backends.mkldnn.is_available()),
            _kernel_sources(),
        ]
    )


def _kernel_sources() -> str:
    """A digest of our kernels' C++ sources: a changed kernel is measured anew."""
    try:
        return cpu_build.sources_digest()[:16]
    except OSError:
        return "no sources"


# Choices measured in this process, by machine key and shape: engines started one after
# another (tests, a restart in place) time each shape once.
_MEASURED: dict[str, dict[str, ShapeChoice]] = {}


@dataclass
class LinearChooser:
    """The choice of kernel for each bf16 projection shape an engine packs."""

    mode: str = KERNEL
    # where measured choices are kept (None: in this process only)
    cache_path: Path | None = field(default_factory=lambda: CACHE_PATH)
    flags: frozenset[str] | None = None  # the CPU's (None: this one's)
    # whether our kernel runs on AMX's tiles (None: as this process's kernels say when a
    # rule is taken, after the engine has set their switch)
    kernel_on_tiles: bool | None = None
    # the shapes chosen for this engine, for the start log: shape -> choice
    chosen: dict[str, ShapeChoice] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(
                f"cpu_linear_kernel must be one of {', '.join(MODES)}; got {self.mode!r}"
            )
        flags = cpu_isa.cpu_flags() if self.flags is None else self.flags
        self.has_amx = "amx_bf16" in flags
        self.key = machine_key(flags)

    def choose(self, shape: str, timer: Callable[[], Timer]) -> ShapeChoice:
        """The choice for ``shape`` (e.g. "3072x576 gated"); ``timer`` makes the timer
        of its candidates, called only where the shape is measured now."""
        if self.mode in (KERNEL, ONEDNN):
            choice = ShapeChoice((self.mode,) * len(TIMED_ROWS), "forced")
        elif self.mode == "rule":
            choice = ShapeChoice(self._rule(), "rule")
        else:
            choice = self._measured(shape, timer)
        self.chosen[shape] = choice
        return choice

    def _rule(self) -> tuple[str, ...]:
        on_tiles = self.kernel_on_tiles
        if on_tiles is None:
            from hetero_infer.kernels.cpu_extension import load_cpu_kernels

            module = load_cpu_kernels()
            on_tiles = module is not None and module.amx_tiles_ready()
        return RULE_WITH_AMX if self.has_amx and not on_tiles else RULE

    def _measured(self, shape: str, timer: Callable[[], Timer]) -> ShapeChoice:
        known = _MEASURED.setdefault(self.key, self._read_cache())
        if shape in known:
            return known[shape]
        time_call = timer()
        seconds = tuple(timed_pair(time_call, rows) for rows in TIMED_ROWS)
        known[shape] = ShapeChoice(pick(seconds), "measured", seconds)
        self._write_cache(known)
        return known[shape]

    def _read_cache(self) -> dict[str, ShapeChoice]:
        if self.cache_path is None or not self.cache_path.exists():
            return {}
        try:
            machines = json.loads(self.cache_path.read_text())
            entries = machines.get(self.key, {})
            choices = {shape: tuple(kernels.split("/")) for shape, kernels in entries.items()}
            return {
                shape: ShapeChoice(kernels, "cached")
                for shape, kernels in choices.items()
                if len(kernels) == len(TIMED_ROWS) and set(kernels) <= {KERNEL, ONEDNN}
            }
        except (OSError, ValueError, AttributeError) as exc:
            logger.warning(
                "cannot read the kernel choices in %s (%s): measuring", self.cache_path, exc
            )
            return {}

    def _write_cache(self, known: dict[str, ShapeChoice]) -> None:
        if self.cache_path is None:
            return
        try:
            machines = json.loads(self.cache_path.read_text()) if self.cache_path.exists() else {}
            kernels = {shape: "/".join(choice.kernels) for shape, choice in known.items()}
            machines[self.key] = kernels
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.cache_path.with_name(f"{self.cache_path.name}.{os.getpid()}")
            temporary.write_text(json.dumps(machines, indent=1) + "\n")
            temporary.replace(self.cache_path)  # whole, for a process reading it at once
        except (OSError, ValueError) as exc:
            logger.warning("cannot keep the kernel choices in %s: %s", self.cache_path, exc)

    def table(self) -> str:
        """What runs where, a line per shape, for the start log."""
        lines = [f"bf16 projections, by rows ({'/'.join(BUCKET_NAMES)}):"]
        for shape, choice in self.chosen.items():
            timed = ""
            if choice.seconds:
                ratios = (f"{ours / onednn:.2f}" for ours, onednn in choice.seconds)
                timed = f"; ours/oneDNN time {'/'.join(ratios)}"
            lines.append(f"  {shape}: {'/'.join(choice.kernels)} ({choice.source}{timed})")
        return "\n".join(lines)


def timed_pair(time_call: Timer, rows: int) -> tuple[float, float]:
    """(ours, oneDNN's) seconds a call at ``rows`` rows: the medians of TIMED_PAIRS
    alternating timings of each, after one of each that warms up."""
    ours, onednn = [], []
    for _ in range(TIMED_PAIRS + 1):
        ours.append(time_call(KERNEL, rows))
        onednn.append(time_call(ONEDNN, rows))
    return statistics.median(ours[1:]), statistics.median(onednn[1:])


def stream_timer(candidates: Callable[[str], list[LinearFn]], in_features: int) -> Timer:
    """Seconds a call of one candidate takes, from a pass over its packed copies
    (``candidates(kind)``, packed at its first timing), each call on the next copy."""
    packed: dict[str, list[LinearFn]] = {}  # each candidate's copies, packed once

    def time_call(kind: str, rows: int) -> float:
        if kind not in packed:
            packed[kind] = candidates(kind)
        copies = packed[kind]
        x = torch.randn(rows, in_features).to(torch.bfloat16)
        with torch.no_grad():
            started = time.perf_counter()
            for linear in copies:
                linear(x)
            return (time.perf_counter() - started) / len(copies)

    return time_call


def num_copies(weight: torch.Tensor) -> int:
    """Copies of ``weight`` a timing streams through (STREAM_BYTES, at most MAX_COPIES)."""
    size = weight.numel() * weight.element_size()
    return max(1, min(MAX_COPIES, -(-STREAM_BYTES // size)))
