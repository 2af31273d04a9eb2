"""How long our server's OpenMP threads should spin between parallel regions: serve one
model with each ``GOMP_SPINCOUNT`` in turn and run the serving benchmark on each.

    python -m bench.openmp_spin --model gemma-3-270m --workload chat --threads 2 \\
        --concurrency 16 --num-prompts 32 --prompt-len 64 --output-len 96 --rounds 3
    python -m bench.openmp_spin ... --busy 1     # beside one busy process

The server's default is engine/entrypoints/process_settings.py's ``OPENMP_SPIN_COUNT``; a count of
0 is ``OMP_WAIT_POLICY=PASSIVE``'s behaviour (sleep at once). ``--busy N`` runs N
processes that spin on the CPU for the whole benchmark, as on a machine shared with
other work. Rounds interleave, the order rotating; each count gets a fresh server.
Writes ``openmp-spin-<model>-<workload>[-busyN].json`` to ``--out``: every round's
output tok/s per count, their medians, and each count's median over the default's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from hetero_infer.engine.entrypoints.process_settings import OPENMP_SPIN_COUNT

from bench import peers
from bench.common import portable


def _spin_counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _spin_forever() -> None:
    while True:
        pass


def serve_with_spin_count(spin_count: int, args: argparse.Namespace, tag: str) -> float:
    """A fresh server of ours with ``GOMP_SPINCOUNT=spin_count``; its output tok/s."""
    env = {"GOMP_SPINCOUNT": str(spin_count)}
    result = peers.run_peer("ours", args, args.out, f"-spin{spin_count}{tag}", env)
    rate = result["summary"]["output_throughput"]
    print(f"-- GOMP_SPINCOUNT={spin_count}{tag}: {rate:.1f} output tok/s", flush=True)
    return rate


def summarize(rates: dict[int, list[float]], default: int) -> dict[str, Any]:
    """Each count's rounds, their median, and that median over the default count's."""
    medians = {count: statistics.median(values) for count, values in rates.items()}
    return {
        str(count): {
            "output_tok_s": rates[count],
            "median_output_tok_s": medians[count],
            "over_default": medians[count] / medians[default] if default in medians else None,
        }
        for count in rates
    }


def main(argv: list[str] | None = None) -> int:
    parser = peers.build_parser()
    parser.prog = "python -m bench.openmp_spin"
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument(
        "--spin-counts",
        type=_spin_counts,
        default=[0, 10_000, int(OPENMP_SPIN_COUNT), 30_000_000],
        help="comma-separated GOMP_SPINCOUNT values",
    )
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside the server")
    args = parser.parse_args(argv)
    peers.resolve_file_args(parser, args, default_dtype="bf16", default_ours_model="folder")
    counts = list(dict.fromkeys(args.spin_counts))
    busy = [multiprocessing.Process(target=_spin_forever, daemon=True) for _ in range(args.busy)]
    for process in busy:
        process.start()
    rates: dict[int, list[float]] = {count: [] for count in counts}
    try:
        for number in range(1, args.rounds + 1):
            round_args = argparse.Namespace(**{**vars(args), "seed": args.seed + number - 1})
            shift = (number - 1) % len(counts)
            for count in counts[shift:] + counts[:shift]:
                rates[count].append(serve_with_spin_count(count, round_args, f"-r{number}"))
    finally:
        for process in busy:
            process.terminate()
    summary = summarize(rates, int(OPENMP_SPIN_COUNT))
    name = f"openmp-spin-{args.model}-{args.workload}" + (f"-busy{args.busy}" if args.busy else "")
    result = {
        "benchmark": "openmp_spin",
        "command": "python -m bench.openmp_spin " + shlex.join(argv or sys.argv[1:]),
        "settings": vars(args),
        "default_spin_count": int(OPENMP_SPIN_COUNT),
        "cpu_count": os.cpu_count(),
        "summary": summary,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{name}.json"
    path.write_text(json.dumps(portable(result), indent=1) + "\n")
    for count, record in summary.items():
        ratio = record["over_default"]
        print(
            f"GOMP_SPINCOUNT={count}: median {record['median_output_tok_s']:.1f} tok/s "
            f"(rounds {', '.join(f'{x:.1f}' for x in record['output_tok_s'])})"
            + (f", {ratio:.2f}x the default" if ratio else "")
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
