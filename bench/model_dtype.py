"""The engine in bf16 against fp32 on a float checkpoint: what ``dtype auto`` weighs on
a CPU without bf16 instructions, where the bf16 linear kernel widens each bf16 pair to
fp32 instead of torch's emulation.

    python -m bench.model_dtype                    # SmolLM2's folder, 5 rounds
    python -m bench.model_dtype --rounds 7 --json out.json

Two engines over the same folder, one per dtype, in one process. Each round runs every
case on both, the order alternating between rounds so that a drift of the shared
machine's load falls on both: a batch of 16 decoding ``--tokens`` tokens each after a
32-token prompt, one stream doing the same, and the prefill of 4 prompts of 512 tokens
(one token generated). A case's figure is tokens per second over its generate() call
(generated tokens; for the prefill, prompt tokens). Reported per case: the median and
range of the rounds' figures on each engine, and of the rounds' ratios (bf16 / fp32).
Results go to ``bench/results/model-dtype-<model>.json`` by default.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch

from bench.common import ab_summary, resolve_model_folder, save_result

DTYPES = ("float32", "bfloat16")


def build_engine(folder: Path, dtype: str) -> Any:
    from hetero_infer.engine import EngineConfig, LLMEngine, apply_process_settings

    config = EngineConfig(
        model=str(folder),
        dtype=dtype,
        max_num_seqs=16,
        max_model_len=1024,
        enable_prefix_caching=False,
    )
    apply_process_settings(config)
    return LLMEngine(config)


def tokens_per_second(engine: Any, prompts: list[list[int]], tokens: int) -> float:
    """Generated tokens per second; with ``tokens`` 1, prompt tokens per second."""
    from hetero_infer.engine import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    outputs = engine.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    if tokens == 1:
        return sum(len(p) for p in prompts) / elapsed
    return sum(len(o.token_ids) for o in outputs) / elapsed


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    folder = resolve_model_folder(args.model)
    engines = {dtype: build_engine(folder, dtype) for dtype in DTYPES}
    vocab = engines["float32"].model_config.vocab_size
    generator = torch.Generator().manual_seed(0)

    def prompt(length: int) -> list[int]:
        return torch.randint(3, vocab, (length,), generator=generator).tolist()

    cases = {
        "batch16_decode": ([prompt(32) for _ in range(16)], args.tokens),
        "single_stream_decode": ([prompt(32)], args.tokens),
        "prefill_4x512": ([prompt(512) for _ in range(4)], 1),
    }
    for prompts, _ in cases.values():  # warm-up
        for engine in engines.values():
            tokens_per_second(engine, prompts, 2)
    rounds = {case: {dtype: [] for dtype in DTYPES} for case in cases}
    for number in range(args.rounds):
        order = DTYPES if number % 2 == 0 else DTYPES[::-1]
        for case, (prompts, tokens) in cases.items():
            for dtype in order:
                rounds[case][dtype].append(tokens_per_second(engines[dtype], prompts, tokens))
    return {
        case: ab_summary(by_dtype, "bfloat16", "float32", "tokens_per_second")
        for case, by_dtype in rounds.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="a benchmark model or a folder")
    parser.add_argument("--tokens", type=int, default=64, help="generated per request")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = run(args)
    for case, r in results.items():
        speeds, ratio = r["tokens_per_second"], r["ratio_bfloat16_over_float32"]
        print(
            f"{case}: fp32 {speeds['float32']['median']:.1f} tok/s, bf16 "
            f"{speeds['bfloat16']['median']:.1f} tok/s; bf16 / fp32 {ratio['median']:.2f} "
            f"({ratio['min']:.2f}-{ratio['max']:.2f})"
        )
    path = args.json or Path(__file__).parent / "results" / f"model-dtype-{args.model}.json"
    settings = {k: getattr(args, k) for k in ("model", "tokens", "rounds", "threads")}
    from bench.throughput import machine_info

    save_result(path, settings, machine_info(), results)


if __name__ == "__main__":
    main()
