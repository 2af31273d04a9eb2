"""Our bf16 linear kernel against oneDNN's on one model's projection shapes, at the rows
each bucket of kernels/linear_choice.py is timed at: what ``cpu_linear_kernel measure``
decides on this CPU, with the spread behind it.

    python -m bench.linear_choice                  # SmolLM2-135M's shapes, 7 rounds
    python -m bench.linear_choice --hidden 4096 --intermediate 14336 --heads 32 --kv-heads 8

Each round times both kernels on every shape and row count as the chooser does once
(``timed_pair``: each call on the next of several copies of the weight, as a step
streams its layers' weights, the two kernels alternating); the figure per cell is ours'
time over oneDNN's (below 1: ours faster), its median and range over the rounds, and the
choice those medians make (oneDNN where it is ONEDNN_MARGIN faster). Written to
``bench/results/linear-choice-<cpu>.json`` with the CPU's model and flags.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import RESULTS_DIR, apply_engine_thread_settings, portable, spread

apply_engine_thread_settings()

import torch  # noqa: E402


def shapes(args: argparse.Namespace) -> dict[str, tuple[int, int, bool]]:
    """A Llama-style layer's bf16 projections: name -> (out, in, gated)."""
    head_dim = args.hidden // args.heads
    qkv = (args.heads + 2 * args.kv_heads) * head_dim
    return {
        "qkv": (qkv, args.hidden, False),
        "o": (args.hidden, args.heads * head_dim, False),
        "gate_up": (2 * args.intermediate, args.hidden, True),
        "down": (args.hidden, args.intermediate, False),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from hetero_infer.kernels import linear_choice
    from hetero_infer.kernels.cpu_extension import load_cpu_kernels
    from hetero_infer.kernels.linear import GatedLinear
    from hetero_infer.kernels.linear_choice import TIMED_ROWS, pick
    from hetero_infer.kernels.linear_cpu import KernelLinear, OneDnnLinear, copies_timer

    from bench.throughput import machine_info

    module = load_cpu_kernels()
    if module is None or not module.linear_packed_available():
        raise SystemExit("our bf16 kernel is not built on this CPU: nothing to choose")
    timers = {}
    layer = shapes(args)
    for name, (out_features, in_features, gated) in layer.items():

        def ours(w: torch.Tensor, gated: bool = gated) -> Any:
            return KernelLinear(module, w, gated=gated)

        def onednn(w: torch.Tensor, gated: bool = gated) -> Any:
            linear = OneDnnLinear(w)
            return GatedLinear(linear, module.silu_and_mul, "silu") if gated else linear

        weight = torch.randn(out_features, in_features).bfloat16()
        timers[name] = copies_timer(weight, ours, onednn)
    ratios: dict[str, dict[int, list[float]]] = {
        name: {rows: [] for rows in TIMED_ROWS} for name in timers
    }
    for round_index in range(args.rounds):
        for name, time_call in timers.items():
            for rows in TIMED_ROWS:
                ours, onednn = linear_choice.timed_pair(time_call, rows)
                ratios[name][rows].append(ours / onednn)
        print(f"round {round_index + 1}/{args.rounds} done")
    results = {}
    for name, by_rows in ratios.items():
        medians = tuple((spread(values)["median"], 1.0) for values in by_rows.values())
        results[name] = {
            "shape": layer[name],
            "ours_over_onednn_time": {
                str(rows): {**spread(v), "rounds": v} for rows, v in by_rows.items()
            },
            "choice": list(pick(medians)),
        }
        cells = "  ".join(
            f"{rows}: {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"
            for rows, s in results[name]["ours_over_onednn_time"].items()
        )
        print(f"{name:8} ours/oneDNN time  {cells}  -> {'/'.join(results[name]['choice'])}")
    machine = machine_info()
    record = {
        "benchmark": "linear_choice",
        "command": "python -m bench.linear_choice "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "threads": torch.get_num_threads(),
        "margin": linear_choice.ONEDNN_MARGIN,
        "timed_rows": list(TIMED_ROWS),
        "machine": machine,
        "results": results,
    }
    cpu = "-".join(machine["cpu"].lower().split()[:3]).replace("(r)", "")
    path = args.out or RESULTS_DIR / f"linear-choice-{cpu}.json"
    path.write_text(json.dumps(portable(record), indent=1) + "\n")
    print(f"written: {path}")
    return record


if __name__ == "__main__":
    main()
