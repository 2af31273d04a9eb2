"""What the benchmarks share: where results go, how a ``--model`` name becomes a
folder, thread counts for their subprocesses, integer lists on the command line, the
summary of an A/B benchmark's rounds, and the text tables and charts they write.

Only the standard library is imported at the top: bench.roofline imports this module
before torch, whose OpenMP settings must be made before it loads (see
``apply_engine_thread_settings``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "bench" / "results"


# ---- the command line ----


def parse_ints(text: str) -> list[int]:
    """``"1,8,32"`` -> [1, 8, 32]: positive integers, as an argparse ``type``."""
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def resolve_model(name: str) -> str:
    """A benchmark model's name (bench/models.py) -> its folder, built on first use, or
    for a GGUF benchmark model (gemma-3-270m) its file; anything else (a folder, a hub
    id, a .gguf file) as given."""
    # Imported here: bench.models loads torch, which must wait for the engine's settings.
    from bench.models import BENCH_MODELS, GGUF_MODELS, model_folder, packaged_gguf

    if name in GGUF_MODELS:
        return str(packaged_gguf(name))
    return str(model_folder(name)) if name in BENCH_MODELS else name


def resolve_model_folder(name: str) -> Path:
    """As ``resolve_model``, for benchmarks whose peers load only a Hugging Face folder:
    anything but a benchmark model's name must be one (else SystemExit)."""
    from bench.models import BENCH_MODELS, GGUF_MODELS, model_folder

    if name in GGUF_MODELS:
        raise SystemExit(f"--model: {name!r} is a GGUF file only, with no model folder")
    if name in BENCH_MODELS:
        return model_folder(name)
    folder = Path(name)
    if not (folder / "config.json").is_file():
        raise SystemExit(f"--model: {name!r} is neither one of {BENCH_MODELS} nor a model folder")
    return folder.resolve()


def save_result(
    path: Path, settings: dict[str, Any], machine: dict[str, Any], results: dict[str, Any]
) -> None:
    """A benchmark's result file: its settings, the machine and its results, made
    portable (they are committed), at ``path``."""
    result = portable({"settings": settings, "machine": machine, "results": results})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


def portable(value: Any) -> Any:
    """A result (JSON-like) with this machine's paths in its strings made relative: the
    repository as ".", the home folder as "~" (result files are committed)."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable(v) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        return value.replace(str(REPO_ROOT), ".").replace(str(Path.home()), "~")
    return value


# ---- threads ----


# The vector and matrix extensions a kernel may use: a figure holds for the CPU kind it
# was measured on, so results record them.
KERNEL_FLAG_PREFIXES = ("avx", "amx", "fma", "f16c")


def cpu_description() -> dict[str, Any]:
    """This CPU's model name and its kernel-relevant flags, as kernels/cpu_isa.py reads
    /proc/cpuinfo (the platform's processor name and no flags where it cannot be read)."""
    from hetero_infer.kernels.cpu_isa import cpu_flags, cpu_model

    flags = sorted(f for f in cpu_flags() if f.startswith(KERNEL_FLAG_PREFIXES))
    return {"cpu": cpu_model() or platform.processor() or platform.machine(), "cpu_flags": flags}


def apply_engine_thread_settings() -> None:
    """The OpenMP settings the server's entry point applies
    (engine/entrypoints/process_settings.py), so that a benchmark runs torch as the
    server does. libgomp reads them when torch loads: call this before anything
    imports torch."""
    from hetero_infer.engine.entrypoints.process_settings import set_openmp_wait_policy

    set_openmp_wait_policy()


def thread_env(threads: int) -> dict[str, str]:
    """The variables that hold OpenMP and MKL to ``threads`` threads in a subprocess: a
    thread torch was not told about (transformers' continuous batching loop, a server's
    workers) takes its team size from them."""
    return {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}


# ---- an A/B benchmark's interleaved rounds ----


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ab_summary(rounds: dict[str, list[float]], a: str, b: str, unit: str) -> dict[str, Any]:
    """Two systems' figures over the same rounds (``rounds[a]``, ``rounds[b]``, in
    ``unit``): each one's median and range and its rounds, and those of the rounds'
    ratios a / b (a round's ratio compares what ran under the same load)."""
    ratios = [x / y for x, y in zip(rounds[a], rounds[b], strict=True)]
    return {
        unit: {k: {**spread(v), "rounds": v} for k, v in rounds.items()},
        f"ratio_{a}_over_{b}": {**spread(ratios), "rounds": ratios},
    }


# ---- tables ----


def column_widths(rows: Sequence[Sequence[str]]) -> list[int]:
    """The widest cell of each column, over all rows (the header included)."""
    return [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]


def align(cells: Sequence[str], widths: Sequence[int], left: int = 1) -> list[str]:
    """Cells padded to their column's width: the first ``left`` (names) to the left,
    the rest (numbers) to the right, so that digits line up."""
    return [
        cell.ljust(width) if i < left else cell.rjust(width)
        for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
    ]


# ---- charts ----


def pyplot() -> ModuleType:
    """matplotlib.pyplot drawing to files only: no display needed. Imported on first
    use, as most runs and every test of the numbers need no chart library."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int) -> Path:
    """Lay ``fig`` out, write it to ``path`` (its folder made as needed) and free it:
    pyplot keeps every open figure alive otherwise."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def checkout_commit() -> str:
    """The checkout's commit, "-dirty" after it where its files differ from it (a copy
    of a work tree over an older repository says so rather than name the older commit);
    "" where git cannot tell."""
    try:
        result = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
    except OSError:
        return ""
    return result.stdout.strip()
