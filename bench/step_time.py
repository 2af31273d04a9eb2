"""Where a decode step's time goes on a GPU: the host's work, the device's, and the
device's idle gaps, with async scheduling on and off.

    python -m bench.step_time                          # needs a CUDA GPU (exits 2 without)
    python -m bench.step_time --batch-sizes 1,64,256 --json out.json

Per batch size B, B requests (16-token prompts, greedy, EOS ignored) decode on random
weights in Qwen2.5-0.5B's shapes (built locally, as bench.throughput's) with CUDA graphs
and the Triton kernels as the engine picks them; once every request decodes, ``--steps``
steps are timed:

- ``step ms``: the median period of ``LLMEngine.step`` (wall clock);
- ``runner ms``: the median time inside the model runner's ``execute`` (its input
  building, the forward pass, sampling and the wait for the sampled tokens);
- ``busy ms``: the GPU's work per step, the union of its kernels' intervals over the
  same steps run again under torch.profiler (which sees kernels inside CUDA graphs);
- ``idle ms``: step - busy, the device waiting for the host;
- ``host ms``: the same steps with the runner replaced by one that computes nothing
  (bench.host_step.IdleRunner): the engine loop's own work above the runner.

Written to ``--json`` with the device, the host (its CPU and flags) and the settings.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch

from bench.common import parse_ints, resolve_model_folder
from bench.host_step import PROMPT_TOKENS, IdleRunner, step_times


class TimedRunner:
    """The engine's runner, with the wall time of each ``execute`` kept."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.seconds: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def execute(self, out: Any) -> Any:
        started = time.perf_counter()
        result = self.runner.execute(out)
        self.seconds.append(time.perf_counter() - started)
        return result


def decode_steps(engine: Any, batch: int, steps: int, first_token: int) -> list[float]:
    """Seconds of each of ``steps`` steps once all ``batch`` requests decode (the
    prompts' steps and the last ones, where requests finish, left out), with the
    engine's runner as it is."""
    return step_times(engine, batch, steps, first_token)[2 : 2 + steps]


def busy_ms(engine: Any, batch: int, steps: int, first_token: int) -> float | None:
    """The device's busy time per step: the union of the kernels' intervals under
    torch.profiler over a run like ``decode_steps``'s, over its steps (the prompts' step
    and the last ones are a few of ``steps + 4``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        count = len(step_times(engine, batch, steps, first_token))
        torch.cuda.synchronize()
    intervals = sorted(
        (event.time_range.start, event.time_range.end)
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    )
    if not intervals:
        return None
    busy_us, (start, end) = 0.0, intervals[0]
    for lo, hi in intervals[1:]:
        if lo > end:
            busy_us += end - start
            start, end = lo, hi
        else:
            end = max(end, hi)
    busy_us += end - start
    return busy_us / 1000 / count


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def measure(engine: Any, batch: int, steps: int, first_token: int) -> dict[str, Any]:
    runner = engine.core.runner
    timed = TimedRunner(runner)
    engine.core.runner = timed
    try:
        step_ms = statistics.median(decode_steps(engine, batch, steps, first_token)) * 1000
        runner_ms = statistics.median(timed.seconds[2 : 2 + steps]) * 1000
        engine.core.runner = IdleRunner(first_token, 0.0)
        host_ms = statistics.median(decode_steps(engine, batch, steps, first_token)) * 1000
    finally:
        engine.core.runner = runner
    try:
        busy = busy_ms(engine, batch, steps, first_token)
        error = None if busy is not None else "the profile held no CUDA kernel"
    except Exception as exc:  # the profiler's API moves between torch releases
        busy, error = None, f"{type(exc).__name__}: {exc}"
    row = {"batch": batch, "step_ms": step_ms, "runner_ms": runner_ms, "host_ms": host_ms}
    row["busy_ms"] = busy
    row["idle_ms"] = None if busy is None else step_ms - busy
    if error:
        row["busy_error"] = error
    return row


def run_mode(args: argparse.Namespace, async_scheduling: bool) -> list[dict[str, Any]]:
    """Each batch size's row with async scheduling on or off, in one engine."""
    from hetero_infer.engine import EngineConfig, LLMEngine

    config = EngineConfig(
        model=str(resolve_model_folder(args.model)),
        dtype="bfloat16",
        max_num_seqs=max(args.batch_sizes),
        kv_cache_memory=2 * 2**30,
        max_model_len=1024,
        async_scheduling=async_scheduling,
    )
    engine = LLMEngine(config)
    first_token = 1000
    decode_steps(engine, 4, 8, first_token)  # warm-up
    rows = []
    for batch in args.batch_sizes:
        row = {
            "async_scheduling": async_scheduling,
            **measure(engine, batch, args.steps, first_token),
        }
        rows.append(row)
        print(
            f"{str(async_scheduling):<6} {batch:>5} {fmt(row['step_ms']):>8} "
            f"{fmt(row['runner_ms']):>9} {fmt(row['busy_ms']):>8} {fmt(row['idle_ms']):>8} "
            f"{fmt(row['host_ms']):>8}",
            flush=True,
        )
        if "busy_error" in row:
            print(f"  busy: {row['busy_error']}")
    if args.profile and not async_scheduling:
        # The host's functions by their own time, the runner's included (one thread).
        profiler = cProfile.Profile()
        profiler.runcall(decode_steps, engine, max(args.batch_sizes), args.steps, first_token)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    engine.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b-shape", help="a name or a folder")
    parser.add_argument("--batch-sizes", type=parse_ints, default="1,64,256")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--async-scheduling", choices=("on", "off", "both"), default="both")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the largest batch's steps (off)"
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval in seconds (Python's default 0.005): how long a thread "
        "that wants the GIL back waits for the other to hand it over",
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if not torch.cuda.is_available():
        print("bench.step_time needs a CUDA GPU, and none is available here.", file=sys.stderr)
        return 2
    print(
        f"{'async':<6} {'batch':>5} {'step ms':>8} {'runner ms':>9} {'busy ms':>8} "
        f"{'idle ms':>8} {'host ms':>8}",
        flush=True,
    )
    if args.async_scheduling == "both":
        # A process per setting: an engine's memory is not all handed back on shutdown,
        # and the second engine sizes its KV cache by what is free.
        rows = []
        with tempfile.TemporaryDirectory() as folder:
            for mode in ("on", "off"):
                path = Path(folder) / f"{mode}.json"
                command = [sys.executable, "-m", "bench.step_time", "--model", args.model]
                command += ["--batch-sizes", ",".join(map(str, args.batch_sizes))]
                command += ["--steps", str(args.steps), "--async-scheduling", mode]
                command += ["--json", str(path)] + (["--profile"] if args.profile else [])
                if args.switch_interval:
                    command += ["--switch-interval", str(args.switch_interval)]
                subprocess.run(command, check=True)
                rows += json.loads(path.read_text())["rows"]
    else:
        rows = run_mode(args, args.async_scheduling == "on")
    if args.json:
        from bench.throughput import machine_info

        result = {
            "device": torch.cuda.get_device_name(),
            "machine": machine_info(),  # the host's CPU sets the pace of a small model
            "model": args.model,
            "settings": {
                "steps": args.steps,
                "prompt_tokens": PROMPT_TOKENS,
                "switch_interval_s": sys.getswitchinterval(),
            },
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
