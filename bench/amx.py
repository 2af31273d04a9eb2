"""Our engine with AMX's tiles on and off (the kernels' switch, the engine's cpu_amx),
in interleaved rounds in one process: what the tiles give on an Intel Xeon that has
them, on the workloads they touch.

    python -m bench.amx                         # the embedded Q4_1 SmolLM2, 5 rounds
    python -m bench.amx --model smollm2         # the bf16 SmolLM2 folder (bench.models)
    python -m bench.amx --cpu-linear-kernel measure   # projections on bf16 tiles too

Workloads, each run to exactly its output length (EOS ignored), all requests at once:
- ``prefill``: 4 prompts of 1,024 random tokens, one output token each (prompt tokens
  a second: the quantized projections of many rows and the prefill attention);
- ``long-prompts``: 24 prompts of 900-1,500 tokens, 16 output tokens each;
- ``chat-16``: 16 chats of 200-400 prompt tokens, 128 sampled output tokens each
  (temperature 0.7, top_p 0.95): a decode step's 16 rows stay on the AVX-512 code, so
  only the prompts gain.
With the tiles off the kernels are the AVX512-VNNI and AVX-512 ones, as before the
tiles; the results file (``bench/results/amx-<model>-<cpu>.json``) holds each round's
tokens a second and the rounds' on / off ratios, with the CPU's model and flags.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import (
    RESULTS_DIR,
    ab_summary,
    apply_engine_thread_settings,
    portable,
    resolve_model,
)

apply_engine_thread_settings()

# name -> (requests, prompt tokens (low, high), output tokens, sampled)
WORKLOADS: dict[str, tuple[int, tuple[int, int], int, bool]] = {
    "prefill": (4, (1024, 1024), 1, False),
    "long-prompts": (24, (900, 1500), 16, False),
    "chat-16": (16, (200, 400), 128, True),
}


def requests(name: str, vocab_size: int, seed: int) -> list[tuple[list[int], Any]]:
    """A workload's prompts (random token ids) and sampling parameters."""
    from hetero_infer.engine import SamplingParams

    count, (low, high), output_len, sampled = WORKLOADS[name]
    rng = random.Random(seed)
    made = []
    for i in range(count):
        prompt = [rng.randrange(100, vocab_size - 100) for _ in range(rng.randint(low, high))]
        sampling = {"temperature": 0.7, "top_p": 0.95, "seed": i} if sampled else {}
        params = SamplingParams(max_tokens=output_len, ignore_eos=True, **sampling)
        made.append((prompt, params))
    return made


def timed_run(llm: Any, work: list[tuple[list[int], Any]]) -> dict[str, float]:
    """All requests at once, to their ends: wall time and tokens a second."""
    started = time.perf_counter()
    ids = [llm.add_request(prompt, params) for prompt, params in work]
    while llm.has_pending_work():
        llm.step()
    wall = time.perf_counter() - started
    outputs = [llm.get_output(i) for i in ids]
    prompt_tokens = sum(len(prompt) for prompt, _ in work)
    output_tokens = sum(len(out.token_ids) for out in outputs)
    return {
        "wall_s": wall,
        "prompt_tokens_per_s": prompt_tokens / wall,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / wall,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded Q4_1 SmolLM2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--cpu-linear-kernel",
        choices=("kernel", "measure", "rule", "onednn"),
        default="kernel",
        help="the engine's setting: other than kernel, the projections' larger calls may run "
        "on bf16 tiles (oneDNN's for bf16 weights, ours over quantized ones dequantized)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    names = [w for w in args.workloads.split(",") if w]
    if unknown := set(names) - set(WORKLOADS):
        parser.error(f"--workloads: unknown {sorted(unknown)}; choose from {list(WORKLOADS)}")

    import torch
    from hetero_infer.engine import EngineConfig, LLMEngine, apply_process_settings
    from hetero_infer.kernels.cpu_extension import load_cpu_kernels

    from bench.gpu_check import device_slug
    from bench.throughput import machine_info

    module = load_cpu_kernels()
    if module is None or not module.amx_tiles_available():
        raise SystemExit("this CPU (or this build, or this process) has no AMX tiles to compare")
    model = {"model": resolve_model(args.model)} if args.model else {}
    config = EngineConfig(**model, cpu_linear_kernel=args.cpu_linear_kernel)
    apply_process_settings(config)
    llm = LLMEngine(config)
    vocab_size = llm.tokenizer.vocab_size
    label = args.model or "smollm2-q4_1-gguf"
    if args.cpu_linear_kernel != "kernel":
        label += f"-{args.cpu_linear_kernel}"
    results: dict[str, Any] = {}
    with torch.inference_mode():
        timed_run(llm, requests("prefill", vocab_size, seed=99))  # warm-up
        for name in names:
            work = requests(name, vocab_size, seed=1)
            rounds: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
            for number in range(args.rounds):
                # Alternating which goes first: a drift in the machine's speed hits both.
                for amx in ("on", "off") if number % 2 == 0 else ("off", "on"):
                    module.set_amx_tiles(amx == "on")
                    llm.core.reset_prefix_cache()  # every round computes its prompts
                    rounds[amx].append(timed_run(llm, work))
            module.set_amx_tiles(True)
            per_s = {k: [r["total_tokens_per_s"] for r in v] for k, v in rounds.items()}
            results[name] = {
                "requests": WORKLOADS[name][0],
                "prompt_len": WORKLOADS[name][1],
                "output_len": WORKLOADS[name][2],
                "sampled": WORKLOADS[name][3],
                **ab_summary(per_s, "on", "off", "total_tokens_per_s"),
                "runs": rounds,
            }
            ratio = results[name]["ratio_on_over_off"]
            print(
                f"{name}: AMX on / off {ratio['median']:.2f}x ({ratio['min']:.2f}-"
                f"{ratio['max']:.2f}); on {max(per_s['on']):.0f}, off {max(per_s['off']):.0f} "
                "tokens/s at best",
                flush=True,
            )
    machine = machine_info()
    path = args.out or RESULTS_DIR / f"amx-{device_slug(label)}-{device_slug(machine['cpu'])}.json"
    record = {
        "settings": {
            "model": label,
            "dtype": str(llm.setup.dtype).removeprefix("torch."),
            "rounds": args.rounds,
            "cpu_linear_kernel": args.cpu_linear_kernel,
            "command": "python -m bench.amx " + " ".join(argv or sys.argv[1:]),
        },
        "machine": machine,
        "results": results,
    }
    path.write_text(json.dumps(portable(record), indent=1) + "\n")
    print(f"written: {path}")
    return record


if __name__ == "__main__":
    main()
