"""Two revisions of the engine, A/B, on this machine: is one slower than the other?

    python -m bench.ab_revisions BASE HEAD                 # git revisions
    python -m bench.ab_revisions 178d687 a886b25 --pairs 30
    python -m bench.ab_revisions 178d687 a886b25 --callgrind

    python -m bench.ab_revisions a6cad27 HEAD --workloads host --batch 256 --pairs 10

Each revision is checked out in a worktree of its own and imported from there, its CPU
kernels built into a directory of its own (a few minutes, once: kept under
``--cache``). Workloads on the embedded SmolLM2 Q4_1, after a warm-up (``--workloads``,
the first two by default):

- ``single``: one greedy request of 2 x ``--output-len`` tokens (its short prompt's
  prefill included);
- ``batch``: ``--batch`` sampled requests at once, ``--output-len`` tokens each;
- ``host``: the host's decode steps at ``--batch`` requests, with a model runner that
  computes nothing (bench/host_step.py), in steps per second; ``host-final`` the same
  with the outputs made only at the end, as offline runs and answers sent whole ask;
- ``prefill`` and ``chat-16``: bench/amx.py's workloads of those names (4 prompts of
  1,024 tokens; 16 sampled chats), prompt and output tokens a second, each run once
  unmeasured first, so that a revision is measured against today's on the same work.

``--settings`` gives both revisions' engines settings (JSON, EngineConfig fields),
``--head-settings`` the head's alone (a setting the base does not know), e.g.
``--settings '{"enable_prefix_caching": false}' --head-settings '{"cpu_amx": false}'``.

Wall time: a round runs one process per revision, in alternating order (ABBA), each
taking the median of ``--repeats`` runs of each workload in tokens per second; the
answer is each round's head/base ratio, its median and a bootstrap 95% interval of
the median. A machine whose speed swings between rounds (a shared VM) widens the
interval: rounds pair neighbours in time.

``--callgrind``: instructions instead of time, which do not swing. Each workload runs
once under valgrind's callgrind on one thread, and so does the warm-up alone; the
workload's count is the difference. Valgrind 3.19 runs no AVX-512, so both sides'
kernels are built for x86-64-v3 (AVX2) there, in fp32 with steps of 256 tokens at
most: the count weighs the Python and the kernels' structure, not this CPU's widest
instructions. The answer is base/head instructions per workload (above 1: the head
runs fewer).

Written to ``--out``/``ab-<base>-<head>.json`` (``ab-callgrind-...`` for counts).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench import amx
from bench.common import RESULTS_DIR, portable

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = ("single", "batch")  # the default ones
# bench/amx.py's workloads of these names, as it builds them.
AMX_WORKLOADS = ("prefill", "chat-16")
ALL_WORKLOADS = (*WORKLOADS, "host", "host-final", *AMX_WORKLOADS)
WORDS = "the of and to in is it that for on with as was at by be this from".split()  # noqa: SIM905
# What valgrind 3.19 can run: no AVX-512.
CALLGRIND_MARCH = "x86-64-v3"
# Under callgrind: fp32, as torch's bf16 matmuls without AVX-512 are emulated a value
# at a time, and a small step, as the KV cache's sizing runs the largest one once.
CALLGRIND_SETTINGS = {"dtype": "float32", "max_num_batched_tokens": 256}


def measure(
    repeats: int,
    batch: int,
    output_len: int,
    workloads: tuple[str, ...] = WORKLOADS,
    **settings: Any,
) -> dict[str, float]:
    """In the child: each workload's median over ``repeats`` runs in tokens per second
    (host: steps per second), with the engine of whichever revision ``hetero_infer``
    imports from (``settings``: its EngineConfig fields)."""
    from hetero_infer.engine import LLMEngine, SamplingParams

    engine = LLMEngine(**settings)
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(48)) for _ in range(batch)]
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    runs = {
        "single": (
            prompts[:1],
            SamplingParams(max_tokens=2 * output_len, temperature=0.0, ignore_eos=True),
        ),
        "batch": (
            prompts,
            SamplingParams(max_tokens=output_len, temperature=0.8, seed=1, ignore_eos=True),
        ),
    }
    engine.generate(prompts[:4], greedy, use_tqdm=False)  # warm-up
    amx_work = {
        name: amx.requests(name, engine.tokenizer.vocab_size, seed=1)
        for name in workloads
        if name in AMX_WORKLOADS
    }
    for work in amx_work.values():  # their first run writes KV blocks for the first time
        amx.timed_run(engine, work)
    rates: dict[str, list[float]] = {name: [] for name in workloads}
    for _ in range(repeats):
        for name in workloads:
            if name in amx_work:
                # Its prompts were run before: without this their prefill is a cache hit.
                engine.core.reset_prefix_cache()
                rates[name].append(amx.timed_run(engine, amx_work[name])["total_tokens_per_s"])
                continue
            if name.startswith("host"):
                final_only = name == "host-final"
                rates[name].append(host_steps_per_second(engine, batch, 40, final_only))
                continue
            workload_prompts, params = runs[name]
            started = time.perf_counter()
            outputs = engine.generate(workload_prompts, params, use_tqdm=False)
            tokens = sum(len(out.token_ids) for out in outputs)
            rates[name].append(tokens / (time.perf_counter() - started))
    return {name: statistics.median(values) for name, values in rates.items() if values}


def host_steps_per_second(engine: Any, batch: int, steps: int, final_only: bool) -> float:
    """Decode steps per second of the engine's loop over ``batch`` requests with a
    model runner that computes nothing: the host's own pace (``final_only``: outputs
    made only at the end)."""
    from bench.host_step import IdleRunner, decode_step_times

    runner = engine.core.runner
    try:
        token_id = engine.tokenizer.encode(" the")[-1]
        idle = IdleRunner(token_id, 0.0)
        times = decode_step_times(engine, idle, batch, steps, final_only)
    finally:
        engine.core.runner = runner
    return 1 / statistics.median(times)


def prepare(rev: str, cache: Path, march: str | None) -> tuple[Path, Path]:
    """A worktree of ``rev`` importable as hetero_infer, and its kernels' build dir."""
    commit = git("rev-parse", "--short", rev)
    root = cache / commit
    tree, package = root / "tree", root / "package"
    kernels = root / ("kernels" if march is None else f"kernels-{march}")
    if not tree.exists():
        git("worktree", "add", "--detach", str(tree), commit)
    package.mkdir(parents=True, exist_ok=True)
    link = package / "hetero_infer"
    if not link.exists():
        link.symlink_to(tree, target_is_directory=True)
    kernels.mkdir(exist_ok=True)
    return package, kernels


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def child_command(
    args: argparse.Namespace, repeats: int, workloads: tuple[str, ...], settings: dict[str, Any]
) -> list[str]:
    command = [sys.executable, "-m", "bench.ab_revisions", "--child"]
    command += ["--repeats", str(repeats), "--batch", str(args.batch)]
    command += ["--output-len", str(args.output_len), "--workloads", ",".join(workloads)]
    command += ["--settings", json.dumps(settings)]
    if args.callgrind:
        command += ["--march", CALLGRIND_MARCH]
    return command


def side_env(package: Path, kernels: Path, threads: int | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        # The revision's package first; this checkout's bench/ after it.
        "PYTHONPATH": os.pathsep.join([str(package), str(REPO)]),
        "TORCH_EXTENSIONS_DIR": str(kernels),
        "PYTHONHASHSEED": "0",
    }
    if threads is not None:  # under callgrind: one thread, and torch's AVX2 kernels
        env.update(OMP_NUM_THREADS=str(threads), ATEN_CPU_CAPABILITY="avx2")
        env.update(ONEDNN_MAX_CPU_ISA="AVX2")
    return env


def side_settings(args: argparse.Namespace, side: str) -> dict[str, Any]:
    """The engine settings of ``side`` ("base" or "head")."""
    return {**args.settings, **(args.head_settings if side == "head" else {})}


def run_side(side: str, package: Path, kernels: Path, args: argparse.Namespace) -> dict[str, float]:
    done = subprocess.run(
        child_command(args, args.repeats, args.workloads, side_settings(args, side)),
        cwd=package,
        env=side_env(package, kernels),
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def callgrind(side: str, package: Path, kernels: Path, args: argparse.Namespace) -> dict[str, int]:
    """Instructions of each workload: its run under callgrind minus the warm-up's."""
    workloads = args.workloads
    settings = side_settings(args, side)
    runs = {"warm-up": (0, workloads), **{name: (1, (name,)) for name in workloads}}
    processes = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, (repeats, ran) in runs.items():
            out = Path(folder) / f"{name}.out"
            command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
            command += child_command(args, repeats, ran, settings)
            processes[name] = (
                subprocess.Popen(
                    command,
                    cwd=package,
                    env=side_env(package, kernels, threads=1),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ),
                out,
            )
        counts = {}
        for name, (process, out) in processes.items():
            if process.wait() != 0:
                raise RuntimeError(f"{name} under callgrind exited {process.returncode}")
            counts[name] = int(re.search(r"^summary: (\d+)", out.read_text(), re.M).group(1))
    return {name: counts[name] - counts["warm-up"] for name in workloads}


def median_interval(ratios: list[float], draws: int = 2000) -> tuple[float, float]:
    """A bootstrap 95% interval of the median."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def wall_time(sides: dict[str, tuple[Path, Path]], args: argparse.Namespace) -> dict[str, Any]:
    for name, (package, kernels) in sides.items():  # builds the kernels, unmeasured
        print(f"{name}: ready, {run_side(name, package, kernels, args)}", flush=True)
    rounds: list[dict[str, dict[str, float]]] = []
    for i in range(args.pairs):
        order = ["base", "head"] if i % 2 == 0 else ["head", "base"]
        result = {name: run_side(name, *sides[name], args) for name in order}
        rounds.append(result)
        ratios = {w: result["head"][w] / result["base"][w] for w in args.workloads}
        print(f"round {i + 1}: " + ", ".join(f"{w} {r:.3f}" for w, r in ratios.items()))
    summary = {}
    for workload in args.workloads:
        ratios = [r["head"][workload] / r["base"][workload] for r in rounds]
        low, high = median_interval(ratios)
        summary[workload] = {
            "head_over_base_median": statistics.median(ratios),
            "interval_95": [low, high],
            "ratios": ratios,
            "base_median": statistics.median(r["base"][workload] for r in rounds),
            "head_median": statistics.median(r["head"][workload] for r in rounds),
        }
        print(f"{workload}: head/base {statistics.median(ratios):.3f} (95% {low:.3f}-{high:.3f})")
    return {"workloads": summary, "rounds": rounds}


def instructions(sides: dict[str, tuple[Path, Path]], args: argparse.Namespace) -> dict[str, Any]:
    for name, (package, kernels) in sides.items():  # builds the kernels, uncounted
        subprocess.run(
            child_command(args, 0, args.workloads, side_settings(args, name)),
            cwd=package,
            env=side_env(package, kernels),
        ).check_returncode()
        print(f"{name}: kernels built for {CALLGRIND_MARCH}", flush=True)
    counts = {name: callgrind(name, *side, args) for name, side in sides.items()}
    summary = {}
    for workload in args.workloads:
        base, head = counts["base"][workload], counts["head"][workload]
        summary[workload] = {"base_instructions": base, "head_instructions": head}
        summary[workload]["base_over_head"] = base / head
        print(f"{workload}: base {base:,} head {head:,} instructions: base/head {base / head:.4f}")
    return {"workloads": summary}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", nargs="?")
    parser.add_argument("head", nargs="?")
    parser.add_argument("--pairs", type=int, default=30, help="rounds, one run of each")
    parser.add_argument("--repeats", type=int, default=3, help="runs of a workload a process")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--callgrind", action="store_true", help="count instructions")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache/hetero-infer/ab")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="of " + ",".join(ALL_WORKLOADS)
    )
    parser.add_argument("--settings", type=json.loads, default={}, help="both engines' (JSON)")
    parser.add_argument("--head-settings", type=json.loads, default={}, help="the head's (JSON)")
    parser.add_argument("--march", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workloads = tuple(args.workloads.split(","))
    if not set(args.workloads) <= set(ALL_WORKLOADS):
        parser.error(f"--workloads: of {','.join(ALL_WORKLOADS)}")
    if args.child:
        if args.march:  # before the kernels are built or loaded
            from hetero_infer.kernels import cpu_build

            cpu_build.CFLAGS[:] = [
                f"-march={args.march}" if flag.startswith("-march=") else flag
                for flag in cpu_build.CFLAGS
            ]
        settings = {**(CALLGRIND_SETTINGS if args.march else {}), **args.settings}
        rates = measure(args.repeats, args.batch, args.output_len, args.workloads, **settings)
        print(json.dumps(rates))
        return {}
    if not (args.base and args.head):
        parser.error("give the base and head revisions")

    from bench.throughput import machine_info

    march = CALLGRIND_MARCH if args.callgrind else None
    sides = {
        name: prepare(rev, args.cache, march)
        for name, rev in (("base", args.base), ("head", args.head))
    }
    measured = instructions(sides, args) if args.callgrind else wall_time(sides, args)
    base, head = git("rev-parse", "--short", args.base), git("rev-parse", "--short", args.head)
    result = {
        "benchmark": "ab_revisions",
        "command": "python -m bench.ab_revisions "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "base": base,
        "head": head,
        "model": "embedded SmolLM2-135M-Instruct Q4_1",
        "settings": {
            k: v for k, v in vars(args).items() if k not in ("out", "cache", "child", "march")
        },
        "machine": machine_info(),
        **measured,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    kind = "ab-callgrind" if args.callgrind else "ab"
    path = args.out / f"{kind}-{base}-{head}.json"
    path.write_text(json.dumps(portable(result), indent=1) + "\n")
    print(f"written: {path}")
    return result


if __name__ == "__main__":
    main()
