"""Prefill attention on a CPU without the tiled kernel: the per-token rows against the
matrix products (kernels/prefill_attention_matmul.py), alone and in the engine.

    python -m bench.prefill_attention                  # SmolLM2, 5 interleaved rounds
    python -m bench.prefill_attention --rounds 3 --prompts 512

- ``kernel``: one chunk's attention at SmolLM2's heads (9 of 64, 3 kv heads) in bf16,
  for each (cached, new) tokens of ``--chunks``: the decode kernel's rows as the CPU
  path ran them, and chunk_attention; a round's figure is the median of 5 calls.
- ``engine``: a prompt of each length of ``--prompts`` prefilled by the embedded
  SmolLM2 (``dtype auto``, one output token), with the matrix products on and off
  (paged_attention_cpu.MATMUL_FROM_PAIRS at its value, or past any chunk); every run
  a prompt of its own, so that no prefix is cached.

The two alternate within a round, so that a drift of the machine's load falls on both.
Reported per case: each one's median and range in ms, and the speedup (rows / products)
as the median and range of the rounds' ratios. Written to
``bench/results/prefill-attention-<cpu>.json`` with the CPU's model and flags.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import (
    RESULTS_DIR,
    ab_summary,
    apply_engine_thread_settings,
    cpu_description,
    parse_ints,
    save_result,
)

apply_engine_thread_settings()

import torch  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
SYSTEMS = ("rows", "matmul")


def parse_chunks(text: str) -> list[tuple[int, int]]:
    """ "0+512,2000+32" -> [(0, 512), (2000, 32)]: (cached, new) tokens of a chunk."""
    chunks = []
    for item in text.split(","):
        cached, new = item.split("+")
        chunks.append((int(cached), int(new)))
    return chunks


def median_ms(call: Callable[[], Any], calls: int = 5) -> float:
    call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def kernel_calls(module: Any, cached: int, new: int) -> dict[str, Callable[[], Any]]:
    """Both ways to one chunk's attention over a cache of noise, in bf16."""
    from hetero_infer.kernels.prefill_attention_matmul import chunk_attention

    context = cached + new
    blocks = -(-context // BLOCK)
    gen = torch.Generator().manual_seed(context)
    shape = (blocks, BLOCK, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).bfloat16()
    v_cache = torch.randn(shape, generator=gen).bfloat16()
    query = torch.randn(new, HEADS, HEAD_DIM, generator=gen).bfloat16()
    table = torch.randperm(blocks, generator=gen).int()
    tables = table.repeat(new, 1)
    visible = torch.arange(cached + 1, context + 1, dtype=torch.int32)
    scale = HEAD_DIM**-0.5
    return {
        "rows": lambda: module.decode_attention(
            query, k_cache, v_cache, tables, visible, scale, 0, 0.0
        ),
        "matmul": lambda: chunk_attention(query, k_cache, v_cache, table, context, scale),
    }


def engine_prefill(engine: Any, length: int, seed: int) -> float:
    """ms to prefill a prompt of ``length`` random tokens and sample one."""
    from hetero_infer.engine import SamplingParams

    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(100, 40000, (length,), generator=gen).tolist()
    start = time.perf_counter()
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    return (time.perf_counter() - start) * 1000


def run(args: argparse.Namespace) -> dict[str, Any]:
    from hetero_infer.engine import EngineConfig, LLMEngine
    from hetero_infer.kernels import paged_attention_cpu
    from hetero_infer.kernels.cpu_extension import load_cpu_kernels

    module = load_cpu_kernels()
    if module is None:
        raise SystemExit("the C++ kernels did not build")
    if module.prefill_attention_available():
        print("note: this CPU has the tiled prefill kernel; the engine's steps use it")
    torch.set_num_threads(args.threads)
    chunks = parse_chunks(args.chunks)
    lengths = parse_ints(args.prompts)
    kernel = {c: {s: [] for s in SYSTEMS} for c in chunks}
    engine = {n: {s: [] for s in SYSTEMS} for n in lengths}
    thresholds = {"rows": float("inf"), "matmul": paged_attention_cpu.MATMUL_FROM_PAIRS}
    llm = LLMEngine(EngineConfig(dtype="auto", max_model_len=max(lengths) + 16))
    seed = 0
    for round_ in range(args.rounds):
        order = SYSTEMS if round_ % 2 == 0 else SYSTEMS[::-1]
        for chunk in chunks:
            calls = kernel_calls(module, *chunk)
            for system in order:
                kernel[chunk][system].append(median_ms(calls[system]))
        for length in lengths:
            for system in order:
                paged_attention_cpu.MATMUL_FROM_PAIRS = thresholds[system]
                seed += 1
                engine[length][system].append(engine_prefill(llm, length, seed))
        paged_attention_cpu.MATMUL_FROM_PAIRS = thresholds["matmul"]
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    return {
        "kernel": {
            f"{cached}+{new}": ab_summary(kernel[(cached, new)], "rows", "matmul", "ms")
            for cached, new in chunks
        },
        "engine": {f"{n}": ab_summary(engine[n], "rows", "matmul", "ms") for n in lengths},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", default="0+128,0+512,0+2048,100+300,2000+32,2000+128")
    parser.add_argument("--prompts", default="128,512,2000")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    results = run(args)
    for part, cases in results.items():
        for case, summary in cases.items():
            ms, ratio = summary["ms"], summary["ratio_rows_over_matmul"]
            print(
                f"{part:6s} {case:>9s}: rows {ms['rows']['median']:8.2f} ms, "
                f"matmul {ms['matmul']['median']:8.2f} ms, speedup {ratio['median']:.2f}x "
                f"({ratio['min']:.2f}-{ratio['max']:.2f})"
            )
    machine = {**cpu_description(), "threads": args.threads}
    slug = "-".join(machine["cpu"].lower().replace("(r)", "").split())
    out = args.out or RESULTS_DIR / f"prefill-attention-{slug}.json"
    save_result(out, vars(args) | {"out": str(out)}, machine, results)
    return results


if __name__ == "__main__":
    main()
