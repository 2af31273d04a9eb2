"""Time to first token of a long prompt whose prefix comes back from the disk tier
after a restart, against the same prompt's cold time to first token.

    python -m bench.kv_tiers                      # SmolLM2, 3 rounds of ~2,000 tokens
    python -m bench.kv_tiers --rounds 1 --prompt-tokens 1000

Per round, a first engine (the embedded SmolLM2 in bf16, a KV pool of 256 blocks of 16
tokens, the RAM and disk tiers on, a fresh directory) times the first token of a prompt
of about ``--prompt-tokens`` tokens, cold, then serves two other prompts of that length,
which evict its blocks from the pool: saved to RAM and written through to the
directory. The engine is dropped; a second engine on the same directory (a restart:
nothing in its pool or RAM) times the first token of the same prompt again, its prefix
read from disk and only the last block computed. Time to first token is the time to a
one-token answer through ``LLMEngine``, nothing else running, after a short warm-up
prompt on each engine.

Reported per round: both times, their ratio, the tokens served from disk; and the median
ratio; written to ``--out``/``kv-tiers.json``.
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

from bench.common import RESULTS_DIR, apply_engine_thread_settings, portable
from bench.two_turn import first_turn_text


def engine_on(directory: Path, ram_gib: float):
    from hetero_infer.engine import EngineConfig, LLMEngine

    config = EngineConfig(
        dtype="bfloat16",
        max_model_len=4096,
        max_num_blocks=256,
        kv_offloading_size=ram_gib,
        kv_offloading_dir=str(directory),
    )
    engine = LLMEngine(config)
    timed_first_token(engine, engine.tokenizer.encode(first_turn_text(100, 99)))  # warm-up
    return engine


def timed_first_token(engine, prompt: list[int]) -> float:
    from hetero_infer.engine import SamplingParams

    started = time.perf_counter()
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    return time.perf_counter() - started


def measure_round(index: int, prompt_tokens: int, ram_gib: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="kv-tiers-") as folder:
        directory = Path(folder)
        first = engine_on(directory, ram_gib)
        encode = first.tokenizer.encode
        prompt = encode(first_turn_text(prompt_tokens, 3 * index))
        cold = timed_first_token(first, prompt)
        for other in (1, 2):  # evict the prompt's blocks from the pool
            timed_first_token(first, encode(first_turn_text(prompt_tokens, 3 * index + other)))
        written = first.memory_stats()["kv_tier_disk_bytes_written"]
        del first
        second = engine_on(directory, ram_gib)
        warm = timed_first_token(second, prompt)
        stats = second.memory_stats()
    result = {
        "round": index,
        "prompt_tokens": len(prompt),
        "cold_ttft_s": cold,
        "from_disk_ttft_s": warm,
        "ratio": warm / cold,
        "tokens_from_tiers": stats["kv_tier_hit_tokens"],
        "disk_blocks_read": stats["kv_tier_disk_hits"],
        "disk_bytes_read": stats["kv_tier_disk_bytes_read"],
        "disk_bytes_written_before_restart": written,
    }
    print(
        f"round {index}: {len(prompt)} tokens, cold {cold * 1e3:.0f} ms, from disk after a "
        f"restart {warm * 1e3:.0f} ms (ratio {warm / cold:.3f}; "
        f"{stats['kv_tier_hit_tokens']} tokens from disk)"
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=2000, help="about")
    parser.add_argument("--ram-gib", type=float, default=0.25, help="kv_offloading_size")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    apply_engine_thread_settings()  # before torch loads, as the server does
    rounds = [measure_round(i, args.prompt_tokens, args.ram_gib) for i in range(args.rounds)]
    ratios = [r["ratio"] for r in rounds]
    summary = {
        "settings": vars(args),
        "model": "smollm2-135m-instruct (embedded), bf16",
        "rounds": rounds,
        "median_ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
    }
    print(f"from disk / cold TTFT: median {summary['median_ratio']:.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kv-tiers.json").write_text(json.dumps(portable(summary), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
