"""Sampled against greedy decoding in the engine alone: what sampling costs.

    python -m bench.sampling                       # embedded SmolLM2 Q4_1, 3 rounds
    python -m bench.sampling --batch-sizes 1,16 --rounds 3 --threads 2

``LLMEngine.generate`` on ``--batch-size`` requests at once (``--prompt-len`` random
tokens each, ``--output-len`` tokens out with ``ignore_eos``), for each kind of
request a chat client sends:

- ``greedy``: temperature 0;
- ``t0.7``: temperature 0.7;
- ``t0.7+seed``: the same with a seed per request;
- ``t0.8+p0.9+k40``: temperature 0.8, top_p 0.9, top_k 40;
- ``chat``: the sampled chat workload of the serving benchmarks (temperature 0.7,
  top_p 0.95, a seed per request).

Output tokens per second over the whole ``generate`` (prefill included). Rounds run
the kinds interleaved (the order rotates each round, new prompts each round), so that
a machine whose speed drifts slows them alike; reported: each kind's rate per round,
its median, and its ratio to greedy per round and of the medians. Written to
``--out``/``sampling-<model>.json`` with the command, the machine, and the load
average as each round began.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import (
    RESULTS_DIR,
    align,
    apply_engine_thread_settings,
    column_widths,
    portable,
)

# kind -> SamplingParams fields (a seed per request where "seed" is True)
KINDS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "t0.7": {"temperature": 0.7},
    "t0.7+seed": {"temperature": 0.7, "seed": True},
    "t0.8+p0.9+k40": {"temperature": 0.8, "top_p": 0.9, "top_k": 40},
    "chat": {"temperature": 0.7, "top_p": 0.95, "seed": True},
}


def run_kind(engine: Any, prompts: list[list[int]], kind: str, output_len: int, seed: int) -> float:
    """Output tokens per second of one generate() over all prompts."""
    from hetero_infer.engine import SamplingParams

    fields = dict(KINDS[kind])
    seeded = fields.pop("seed", False)
    params = [
        SamplingParams(
            max_tokens=output_len, ignore_eos=True, seed=seed + i if seeded else None, **fields
        )
        for i in range(len(prompts))
    ]
    started = time.perf_counter()
    outputs = engine.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    return sum(len(o.token_ids) for o in outputs) / elapsed


def summarize(rates: dict[str, list[float]]) -> dict[str, Any]:
    """Per kind: its rounds, median, and ratio to greedy (per round and of medians)."""
    greedy = rates["greedy"]
    out = {}
    for kind, values in rates.items():
        out[kind] = {
            "tok_s": values,
            "median_tok_s": statistics.median(values),
            "ratio_to_greedy": [v / g for v, g in zip(values, greedy, strict=True)],
            "median_ratio": statistics.median(values) / statistics.median(greedy),
        }
    return out


def format_table(result: dict[str, Any]) -> str:
    rows = [["batch", "kind", "median tok/s", "x greedy", "rounds (x greedy)"]]
    for batch, kinds in result["batches"].items():
        for kind, record in kinds.items():
            spread = ", ".join(f"{r:.2f}" for r in record["ratio_to_greedy"])
            rows.append(
                [
                    batch,
                    kind,
                    f"{record['median_tok_s']:.1f}",
                    f"{record['median_ratio']:.2f}",
                    spread,
                ]
            )
    widths = column_widths(rows)
    return "\n".join("  ".join(align(row, widths)) for row in rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2 Q4_1")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if "greedy" not in kinds or set(kinds) - set(KINDS):
        parser.error(f"--kinds: choose from {', '.join(KINDS)}, greedy included")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    apply_engine_thread_settings()
    import torch
    from hetero_infer.engine import EngineConfig, LLMEngine, apply_process_settings

    from bench.throughput import machine_info

    torch.set_num_threads(args.threads)
    config = EngineConfig(model=args.model, dtype=args.dtype, max_num_seqs=max(batch_sizes))
    apply_process_settings(config)
    engine = LLMEngine(config)
    vocab = engine.model_config.vocab_size
    rng = torch.Generator().manual_seed(args.seed)
    run_kind(engine, [[1] * args.prompt_len], "greedy", 8, 0)  # warm up
    rates: dict[int, dict[str, list[float]]] = {b: {k: [] for k in kinds} for b in batch_sizes}
    loads = []
    for round_index in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for batch in batch_sizes:
            prompts = torch.randint(100, vocab, (batch, args.prompt_len), generator=rng).tolist()
            shift = round_index % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                rate = run_kind(engine, prompts, kind, args.output_len, args.seed + round_index)
                rates[batch][kind].append(rate)
                print(
                    f"round {round_index + 1} batch {batch:3d} {kind:14s} {rate:8.1f} tok/s",
                    flush=True,
                )
    result = {
        "benchmark": "sampling",
        "command": "python -m bench.sampling "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "model": args.model or "embedded SmolLM2-135M-Instruct Q4_1",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine_info(),
        "load_average_per_round": loads,
        "batches": {str(b): summarize(rates[b]) for b in batch_sizes},
    }
    print(format_table(result))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sampling-smollm2.json"
    path.write_text(json.dumps(portable(result), indent=1) + "\n")
    print(f"written: {path}")
    return result


if __name__ == "__main__":
    main()
