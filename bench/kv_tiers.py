"""The disk tier across a restart, and what it costs a busy engine.

    python -m bench.kv_tiers                      # SmolLM2: 3 restart rounds, 5 decode rounds
    python -m bench.kv_tiers --rounds 1 --decode-rounds 1 --prompt-tokens 1000

**Restart.** Per round, a first engine (the embedded SmolLM2 in ``--dtype``, bf16 by
default; a KV pool of 256 blocks of 16 tokens, the RAM and disk tiers on, a fresh
directory) times the first token of a prompt of about ``--prompt-tokens`` tokens, cold,
and stops as a SIGTERM stops the server (``LLMEngine.shutdown``). Nothing was evicted:
the blocks reached the disk as they were computed, or at the stop. A second engine on
the same directory (a restart: nothing in its pool or RAM) times the first token of the
same prompt, its prefix read from disk and only the last block computed. Time to first
token is the time to a one-token answer through ``LLMEngine``, nothing else running,
after a short warm-up prompt on each engine.

**Decode cost.** Two engines, the same but for the tiers (RAM and disk on, or off),
serve ``--users`` sampled answers of ``--answer-tokens`` tokens to as many prompts of
about 128 tokens (new prompts each round, the same for both), in interleaved rounds
(the order alternating); each round's output tokens per second, and the ratio with
tiers / without. With the tiers on, each block computed is copied and written to disk.

Written to ``--out``/``kv-tiers.json``, with the machine's CPU and flags.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import RESULTS_DIR, ab_summary, apply_engine_thread_settings, portable
from bench.two_turn import first_turn_text, timed_first_token


def engine_on(directory: Path | None, ram_gib: float, dtype: str, max_num_blocks: int = 256):
    from hetero_infer.engine import EngineConfig, LLMEngine

    tiers = {}
    if directory is not None:
        tiers = dict(kv_offloading_size=ram_gib, kv_offloading_dir=str(directory))
    config = EngineConfig(dtype=dtype, max_model_len=4096, max_num_blocks=max_num_blocks, **tiers)
    engine = LLMEngine(config)
    timed_first_token(engine, engine.tokenizer.encode(first_turn_text(100, 99)))  # warm-up
    return engine


def restart_round(index: int, prompt_tokens: int, ram_gib: float, dtype: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="kv-tiers-") as folder:
        directory = Path(folder)
        first = engine_on(directory, ram_gib, dtype)
        prompt = first.tokenizer.encode(first_turn_text(prompt_tokens, 3 * index))
        cold = timed_first_token(first, prompt)
        stopping = time.perf_counter()
        first.shutdown()
        stop_s = time.perf_counter() - stopping
        written = first.memory_stats()["kv_tier_disk_bytes_written"]
        evicted = first.memory_stats()["kv_tier_ram_blocks"]
        del first
        second = engine_on(directory, ram_gib, dtype)
        warm = timed_first_token(second, prompt)
        stats = second.memory_stats()
    result = {
        "round": index,
        "prompt_tokens": len(prompt),
        "cold_ttft_s": cold,
        "after_restart_ttft_s": warm,
        "ratio": warm / cold,
        "stop_s": stop_s,
        "blocks_evicted_before_stop": evicted,
        "disk_bytes_written_before_restart": written,
        "tokens_from_tiers": stats["kv_tier_hit_tokens"],
        "disk_blocks_read": stats["kv_tier_disk_hits"],
    }
    print(
        f"restart round {index}: {len(prompt)} tokens, cold {cold * 1e3:.0f} ms, after a "
        f"stop and restart {warm * 1e3:.0f} ms (ratio {warm / cold:.3f}; stop {stop_s:.2f} s; "
        f"{stats['kv_tier_hit_tokens']} tokens from disk)"
    )
    return result


def decode_rate(engine, prompts: list[list[int]], answer_tokens: int) -> float:
    from hetero_infer.engine import SamplingParams

    params = SamplingParams(
        max_tokens=answer_tokens, temperature=0.7, top_p=0.9, seed=0, ignore_eos=True
    )
    started = time.perf_counter()
    outputs = engine.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    return sum(len(o.token_ids) for o in outputs) / elapsed


def decode_rounds(rounds: int, users: int, answer_tokens: int, ram_gib: float, dtype: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="kv-tiers-") as folder:
        engines = {
            "tiers": engine_on(Path(folder), ram_gib, dtype, max_num_blocks=1024),
            "none": engine_on(None, 0, dtype, max_num_blocks=1024),
        }
        encode = engines["none"].tokenizer.encode
        rates: dict[str, list[float]] = {"tiers": [], "none": []}
        for index in range(rounds):
            prompts = [encode(first_turn_text(128, 1000 + index * users + u)) for u in range(users)]
            order = ["tiers", "none"] if index % 2 == 0 else ["none", "tiers"]
            for name in order:
                rates[name].append(decode_rate(engines[name], prompts, answer_tokens))
            print(
                f"decode round {index}: with tiers {rates['tiers'][-1]:.1f} tok/s, "
                f"without {rates['none'][-1]:.1f} tok/s"
            )
        written = engines["tiers"].memory_stats()["kv_tier_disk_bytes_written"]
        dropped = engines["tiers"].memory_stats()["kv_tier_disk_writes_dropped"]
        engines["tiers"].shutdown()
    return {**ab_summary(rates, "tiers", "none", "output_tok_per_s"),
            "disk_bytes_written": written, "disk_writes_dropped": dropped}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="restart rounds")
    parser.add_argument("--prompt-tokens", type=int, default=2000, help="about")
    parser.add_argument("--decode-rounds", type=int, default=5)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--ram-gib", type=float, default=0.25, help="kv_offloading_size")
    # float32 where the CPU has no bf16 instructions (bf16 is emulated there, slowly).
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    apply_engine_thread_settings()  # before torch loads, as the server does
    from bench.throughput import machine_info

    restarts = [
        restart_round(i, args.prompt_tokens, args.ram_gib, args.dtype) for i in range(args.rounds)
    ]
    ratios = [r["ratio"] for r in restarts]
    decode = decode_rounds(
        args.decode_rounds, args.users, args.answer_tokens, args.ram_gib, args.dtype
    )
    summary = {
        "settings": vars(args),
        "model": f"smollm2-135m-instruct (embedded), {args.dtype}",
        "machine": machine_info(),
        "restart_rounds": restarts,
        "restart_median_ratio": statistics.median(ratios),
        "restart_ratio_range": [min(ratios), max(ratios)],
        "decode": decode,
    }
    ratio = decode["ratio_tiers_over_none"]
    print(
        f"after a restart / cold TTFT: median {summary['restart_median_ratio']:.3f}; decode "
        f"with tiers / without: median {ratio['median']:.3f} "
        f"({ratio['min']:.3f}-{ratio['max']:.3f})"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kv-tiers.json").write_text(json.dumps(portable(summary), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
