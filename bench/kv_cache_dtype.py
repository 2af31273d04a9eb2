"""Decode at a long context with the KV cache in the model's dtype against int8.

    python -m bench.kv_cache_dtype   # SmolLM2, bf16, batch 1, 8k context
    python -m bench.kv_cache_dtype --context 2048,8192 --rounds 7 --json out.json

At a long context a decode step reads more KV than weights (SmolLM2's bf16 cache holds
23 KB a token over its 30 layers: 189 MB at 8k, against 97 MB of Q4_1 weights), so the
int8 cache's half-size rows should show in the step time. Each round times a decode step
(the model's forward pass through its fast path and the last-token logits, over
synthetic inputs of ``--batch`` sequences with ``--context`` cached tokens: bench/
roofline.py's time_decode_step) for each cache dtype, the order alternating between
rounds so that a drift of the shared machine's load falls on both; a round's figure is
the median of its ``--steps`` timed steps. Reported: per dtype the median and range of
the rounds' figures, and the speedup (auto / int8) as the median and range of the
rounds' ratios. Results go to ``bench/results/kv-cache-dtype-<model>.json`` by default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch

from bench.common import parse_ints, resolve_model, spread
from bench.roofline import blocks_needed, time_decode_step

KINDS = ("auto", "int8")


def build_engine(model: str, dtype: str, kv_cache_dtype: str, batch: int, context: int) -> Any:
    from hetero_infer.engine import EngineConfig, LLMEngine, apply_process_settings

    config = EngineConfig(
        model=model,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        max_num_seqs=batch,
        max_model_len=context + 1,
        max_num_blocks=blocks_needed(batch, context, 16),
        enable_prefix_caching=False,
    )
    apply_process_settings(config)
    return LLMEngine(config)


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model = resolve_model(args.model)
    results: dict[str, Any] = {}
    for context in parse_ints(args.context):
        engines = {k: build_engine(model, args.dtype, k, args.batch, context) for k in KINDS}
        rounds: dict[str, list[float]] = {k: [] for k in KINDS}
        for number in range(args.rounds):
            order = KINDS if number % 2 == 0 else KINDS[::-1]
            for kind in order:
                runner = engines[kind].runner
                times = time_decode_step(runner, args.batch, context, args.steps, warmup=1)
                rounds[kind].append(statistics.median(times) * 1e3)
        ratios = [a / b for a, b in zip(rounds["auto"], rounds["int8"], strict=True)]
        results[str(context)] = {
            "step_ms": {k: {**spread(v), "rounds": v} for k, v in rounds.items()},
            "speedup_int8": {**spread(ratios), "rounds": ratios},
            "kv_bytes_per_token": {
                k: engines[k].runner.bytes_per_block // engines[k].runner.block_size for k in KINDS
            },
        }
        del engines
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--context", default="8191", help="cached tokens, comma-separated")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=10, help="timed decode steps a round")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = run(args)
    for context, r in results.items():
        step = r["step_ms"]
        print(
            f"context {context}, batch {args.batch}: step ms auto {step['auto']['median']:.2f} "
            f"({step['auto']['min']:.2f}-{step['auto']['max']:.2f}), int8 "
            f"{step['int8']['median']:.2f} ({step['int8']['min']:.2f}-{step['int8']['max']:.2f}); "
            f"int8 speedup {r['speedup_int8']['median']:.2f}x "
            f"({r['speedup_int8']['min']:.2f}-{r['speedup_int8']['max']:.2f})"
        )
    path = args.json or Path(__file__).parent / "results" / f"kv-cache-dtype-{args.model}.json"
    settings = {k: getattr(args, k) for k in ("model", "dtype", "batch", "rounds", "steps")}
    settings["threads"] = args.threads
    path.write_text(json.dumps({"settings": settings, "results": results}, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
