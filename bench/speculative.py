"""Decode speed with and without speculative decoding: n-gram and a draft model.

    python -m bench.speculative                          # SmolLM2, 3 rounds
    python -m bench.speculative --rounds 5 --output-len 200
    python -m bench.speculative --spec '{"method": "ngram", "num_speculative_tokens": 3}'
    python -m bench.speculative --draft-spec '{"model": "default", "num_speculative_tokens": 3}'
    python -m bench.speculative --modes off,draft --workloads batch

One engine per mode in one process, the same target model and settings: ``off`` (no
speculation), ``ngram`` (``--spec`` as its speculative_config) and ``draft``
(``--draft-spec``: by default the embedded SmolLM2's own Q4_1 file, kept quantized,
drafting for the target, which by default is the same model dequantized to bf16
(``--quantization none``): the same tokenizer, nearly the same distribution, and a
draft that reads about a third of the target's bytes per token). Workloads:

- ``grounded``: the chat model is asked to rewrite a given paragraph with its spelling
  mistakes corrected, greedy, so the answer copies long spans of the prompt (where
  n-gram proposals are accepted); one request at a time;
- ``random``: a prompt of random tokens to continue (``ignore_eos``), sampled at
  temperature 1 with a seed, one request at a time (greedy, a small model falls into
  a loop on such a prompt, which the n-gram proposer would catch): n-gram proposals
  are rare and mostly rejected, and what is measured is what speculation costs when
  it does not help; a draft model is sampled too, and rejection-sampled;
- ``batch``: ``--batch-size`` grounded requests at once (continuous batching), greedy:
  output tokens per second of the whole batch, from the first request in to the last
  token out.

Rounds interleave the modes (rotating which goes first), each round with the same
prompts for all, so that a shared machine whose speed drifts slows them alike. A
single-stream request's decode speed is its output tokens after the first over the
time after the first: ``(n - 1) / (finished - first token)``. Reported per workload
and mode: the median over all requests (the batch's tokens/s), each round's, the
ratio to ``off`` per round and overall, and the acceptance (accepted / drafted tokens,
and tokens per verifying step).

Written to ``--out``: ``speculative-<model>.json`` (every request, the settings).
"""

from __future__ import annotations

import argparse
import json
import os
import random
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

DEFAULT_SPEC = {
    "method": "ngram",
    "num_speculative_tokens": 5,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}
# The embedded model's Q4_1 file, kept quantized, for the target dequantized; no drafts
# in steps of more than 8 running requests, where they cost more than they save.
DEFAULT_DRAFT_SPEC = {"model": "default", "num_speculative_tokens": 4, "disable_by_batch_size": 8}
MODES = ("off", "ngram", "draft")
WORKLOADS = ("grounded", "random", "batch")

# Paragraphs to rewrite, each with a few misspellings for the model to fix.
PARAGRAPHS = [
    "The old lighthouse stood at the end of the rocky point for more than a hundred "
    "years. Every night the keeper climbed the narow stairs to light the lamp, and "
    "every morning he wrote the wether in a thick leather book. Ships passing the "
    "point could see the beam from twenty miles away, and many sailors said it had "
    "saved there lives during the winter storms.",
    "To make a simple bread, mix flour, water, salt and a little yeast in a large "
    "bowl. Knead the dough for ten minutes untill it is smooth, then leave it in a "
    "warm place to rise for an hour. Shape it into a loaf, let it rise again, and "
    "bake it in a hot oven for about fourty minutes, until the crust is golden brown.",
    "The city council met on Tuesday to discuss the new bicycle lanes. Several "
    "residents spoke in favour of the plan, saying that safer streets would "
    "encourage more people to cycle to work. Others worried about the loss of "
    "parking spaces. The council agreed to hold a public meeting next month before "
    "making a final desicion.",
    "Honeybees live in colonies that can contain tens of thousands of workers. The "
    "workers gather nectar and pollen, build the wax comb, and care for the young. "
    "A single queen lays all of the eggs, sometimes more then a thousand in one day. "
    "In winter the bees cluster together to keep warm, slowly eating the honey they "
    "stored during the summer.",
]
INSTRUCTION = (
    "Rewrite the text below with its spelling mistakes corrected. Keep every other "
    "word exactly as it is.\n\n"
)


def grounded_prompts(engine: Any, count: int, seed: int) -> list[Any]:
    rng = random.Random(seed)
    paragraphs = [PARAGRAPHS[(seed + i) % len(PARAGRAPHS)] for i in range(count)]
    rng.shuffle(paragraphs)
    return [
        engine.tokenizer.apply_chat_template([{"role": "user", "content": INSTRUCTION + text}])
        for text in paragraphs
    ]


def random_prompts(vocab_size: int, count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # Past the first few hundred ids, which hold special and byte tokens.
    return [[rng.randrange(300, vocab_size) for _ in range(length)] for _ in range(count)]


def decode_speed(output: Any) -> float | None:
    """Output tokens after the first per second after the first (None: too short)."""
    m = output.metrics
    n = len(output.token_ids)
    if n < 2 or m.first_token_time is None or m.finished_time is None:
        return None
    elapsed = m.finished_time - m.first_token_time
    return (n - 1) / elapsed if elapsed > 0 else None


def run_requests(engine: Any, prompts: list[Any], params: Any) -> list[dict[str, Any]]:
    """One request at a time; each one's decode speed and length."""
    records = []
    for prompt in prompts:
        before = spec_counts(engine)
        (output,) = engine.generate([prompt], params, use_tqdm=False)
        after = spec_counts(engine)
        records.append(
            {
                "prompt_tokens": len(output.prompt_token_ids),
                "output_tokens": len(output.token_ids),
                "decode_tok_s": decode_speed(output),
                "draft_tokens": after[0] - before[0],
                "accepted_tokens": after[1] - before[1],
                "drafts": after[2] - before[2],
            }
        )
    return records


def run_batch(engine: Any, prompts: list[Any], params: Any) -> list[dict[str, Any]]:
    """Every prompt at once: one record for the whole batch (its output tokens per
    second from start to end)."""
    before = spec_counts(engine)
    started = time.perf_counter()
    outputs = engine.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    after = spec_counts(engine)
    tokens = sum(len(output.token_ids) for output in outputs)
    return [
        {
            "requests": len(outputs),
            "prompt_tokens": sum(len(output.prompt_token_ids) for output in outputs),
            "output_tokens": tokens,
            "seconds": elapsed,
            "decode_tok_s": tokens / elapsed,
            "draft_tokens": after[0] - before[0],
            "accepted_tokens": after[1] - before[1],
            "drafts": after[2] - before[2],
        }
    ]


def spec_counts(engine: Any) -> tuple[int, int, int]:
    stats = engine.metrics.spec_decode
    return stats.num_draft_tokens, stats.num_accepted_tokens, stats.num_drafts


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    speeds = [r["decode_tok_s"] for r in records if r["decode_tok_s"] is not None]
    drafted = sum(r["draft_tokens"] for r in records)
    accepted = sum(r["accepted_tokens"] for r in records)
    drafts = sum(r["drafts"] for r in records)
    return {
        "median_decode_tok_s": statistics.median(speeds) if speeds else None,
        "requests": len(records),
        "output_tokens": sum(r["output_tokens"] for r in records),
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "tokens_per_verifying_step": 1 + accepted / drafts if drafts else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a folder or .gguf (default: SmolLM2)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--quantization",
        default="none",
        help="the target's (default none: a GGUF target is dequantized, as a draft model "
        "made from the same file is only cheaper than a target that is not quantized)",
    )
    parser.add_argument("--spec", type=json.loads, default=DEFAULT_SPEC, help="n-gram JSON")
    parser.add_argument(
        "--draft-spec", type=json.loads, default=DEFAULT_DRAFT_SPEC, help="draft-model JSON"
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=4, help="per workload and round")
    parser.add_argument("--output-len", type=int, default=160)
    parser.add_argument("--random-prompt-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    if set(workloads) - set(WORKLOADS):
        parser.error(f"--workloads: choose from {', '.join(WORKLOADS)}")
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES) or "off" not in modes:
        parser.error(f"--modes: choose from {', '.join(MODES)}, off included")

    apply_engine_thread_settings()
    from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

    base = EngineConfig(
        model=args.model,
        dtype=args.dtype,
        quantization=args.quantization,
        max_num_seqs=max(args.batch_size, 1),
    )
    specs = {"off": None, "ngram": args.spec, "draft": args.draft_spec}
    engines = {mode: LLMEngine(base.replace(speculative_config=specs[mode])) for mode in modes}
    vocab = engines["off"].model_config.vocab_size
    params = {
        "grounded": SamplingParams(temperature=0.0, max_tokens=args.output_len),
        "random": SamplingParams(
            temperature=1.0, seed=args.seed, max_tokens=args.output_len, ignore_eos=True
        ),
        "batch": SamplingParams(temperature=0.0, max_tokens=args.output_len),
    }
    records: dict[str, dict[str, list[list[dict[str, Any]]]]] = {
        w: {mode: [] for mode in engines} for w in workloads
    }
    loads = []
    for round_index in range(args.rounds):
        loads.append(os.getloadavg()[0])
        seed = args.seed + round_index
        for workload in workloads:
            if workload == "grounded":
                prompts = grounded_prompts(engines["off"], args.requests, seed)
            elif workload == "batch":
                prompts = grounded_prompts(engines["off"], args.batch_size, seed)
            else:
                prompts = random_prompts(vocab, args.requests, args.random_prompt_len, seed)
            # Rotate which mode goes first, so none always meets a warmer machine.
            shift = round_index % len(modes)
            for mode in modes[shift:] + modes[:shift]:
                started = time.monotonic()
                run = run_batch if workload == "batch" else run_requests
                found = run(engines[mode], prompts, params[workload])
                records[workload][mode].append(found)
                median = summarize(found)["median_decode_tok_s"]
                print(
                    f"round {round_index + 1} {workload:8s} {mode:5s}: "
                    f"{'batch' if workload == 'batch' else 'median'} "
                    f"{median or 0:.1f} tok/s ({time.monotonic() - started:.0f} s)",
                    flush=True,
                )

    from bench.throughput import machine_info

    report = {
        "benchmark": "speculative",
        "command": "python -m bench.speculative "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine_info(),
        "load_average_per_round": loads,
        "workloads": {},
    }
    rows = [["workload", "speculation", "median tok/s", "round medians", "/off", "acceptance"]]
    for workload in workloads:
        entry: dict[str, Any] = {}
        for mode in engines:
            rounds = records[workload][mode]
            entry[mode] = {
                **summarize([r for found in rounds for r in found]),
                "round_medians": [summarize(found)["median_decode_tok_s"] for found in rounds],
                "rounds": rounds,
            }
        off = entry["off"]
        for mode in engines:
            if mode == "off":
                continue
            mine = entry[mode]
            a, b = mine["median_decode_tok_s"], off["median_decode_tok_s"]
            mine["over_off"] = a / b if a and b else None
            mine["over_off_per_round"] = [
                x / y if x and y else None
                for x, y in zip(mine["round_medians"], off["round_medians"], strict=True)
            ]
        report["workloads"][workload] = entry
        for mode in engines:
            e = entry[mode]
            rate = e["acceptance_rate"]
            acceptance = (
                f"{rate:.0%} of {e['draft_tokens']} drafted, "
                f"{e['tokens_per_verifying_step']:.2f} tok/step"
                if rate is not None
                else "-"
            )
            ratio = e.get("over_off")
            rows.append(
                [
                    workload,
                    mode,
                    f"{e['median_decode_tok_s'] or 0:.1f}",
                    ", ".join(f"{m or 0:.1f}" for m in e["round_medians"]),
                    f"{ratio:.2f}x" if ratio else "",
                    acceptance,
                ]
            )
    widths = column_widths(rows)
    for row in rows:
        print("  ".join(align(row, widths, left=2)))
    args.out.mkdir(parents=True, exist_ok=True)
    name = Path(args.model).stem if args.model else "smollm2"
    path = args.out / f"speculative-{name}.json"
    path.write_text(json.dumps(portable(report), indent=1) + "\n")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
