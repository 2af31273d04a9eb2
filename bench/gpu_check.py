"""The checks for a day with an NVIDIA GPU, in one command: the tests marked ``cuda``,
then the GPU benchmarks, their results in one file per device under bench/results/.

    python -m bench.gpu_check              # needs a GPU: exits 2, saying so, without one
    python -m bench.gpu_check --dry-run    # what it would run (on any machine)
    make gpu-check                         # the same with the virtualenv's python
    make gpu-check GPU_PYTHON=python3      # a python that has a CUDA torch already

What runs, each step a subprocess with its own time limit (a hang costs that step
only; the limits add up to about 11 minutes, an H200 took about 8):

1. ``cuda tests``: every test marked ``cuda`` (found by reading tests/ for the marker),
   by ``pytest -m cuda`` on their files, with a JUnit report. TRITON_INTERPRET=0, so
   that tests/conftest.py leaves the interpreter off and they check the
   compiled kernels.
2. ``kernels``: ``bench.kernels`` on short shapes: decode attention, RMSNorm and the
   linear layers on weight-only int8 rows, as GB/s against the device's memory
   bandwidth and time against the torch code.
3. ``planes linear``: ``bench.planes_linear``: the linear layers on GGUF weights in
   the GPU's planes (Q4_0, Q4_K, Q8_0) on Llama-8B's projections at 1 and 16 rows,
   against torch's bf16 matmul on the dequantized weight, the kernel on the file's
   blocks and the memory bound; it fails where a product is wrong.
4. ``planes sweep``: the same with other tiles beside the chosen ones.
5. ``step time``: ``bench.step_time``: the engine's decode step split into the host's
   work, the GPU's busy time and its idle gaps, with async scheduling on and off.
6. ``throughput``: ``bench.throughput``, offline, our engine against transformers'
   continuous batching on the same GPU: a short greedy workload on random weights in
   Qwen2.5-0.5B's shapes (built locally, nothing downloaded), CUDA graphs and the
   Triton kernels as the engine picks them.
7. ``gemv profile``, where Nsight Compute (``ncu``) is installed: one launch of the
   planes' decode GEMV (``bench.planes_once``: Q4_0, 14,336 x 4,096, one row)
   profiled in full, the report in the run's folder as ``ncu-gemv.txt``.

A SIGINT stops the step running and the rest; what ran is still written.

Written: ``bench/results/gpu-check-<device>.json`` (the device, the tests' counts and
failures, each benchmark's figures; committed like the other summaries), each step's
log under bench/results/logs/ and its raw files under bench/results/runs/. Exit status
0 when every step passed, 1 when one failed, 2 without a GPU.

hetero_infer need not be installed: where the python has no such package, the steps
import it from this checkout (through a folder of links, as pyproject.toml maps it).
What that python needs beside torch and triton is listed at the Makefile's gpu-check.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import REPO_ROOT, RESULTS_DIR, checkout_commit, portable

TESTS_DIR = REPO_ROOT / "tests"
# The folders pyproject.toml maps to hetero_infer's parts.
PACKAGE_PARTS = ("engine", "kernels", "server")
DEFAULT_MODEL = "qwen2.5-0.5b-shape"
EXIT_FAILED = 1
# Compiled kernels; the test workers' CPU threads (transformers' references) split the cores.
CUDA_TESTS_ENV = {"TRITON_INTERPRET": "0", "OMP_NUM_THREADS": "2"}
EXIT_NO_GPU = 2
# Where CUDA's installers put Nsight Compute when it is not on the PATH.
NCU_PATHS = ("/usr/local/cuda/bin/ncu",)
# The steps that write a JSON result, and its name under the run's folder.
RESULT_FILES = {
    "kernels": "kernels.json",
    "planes linear": "planes-linear.json",
    "planes sweep": "planes-sweep.json",
    "step time": "step-time.json",
}


@dataclass
class Step:
    """One subprocess of the check."""

    name: str
    command: list[str]
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)  # on top of the check's own


@dataclass
class Device:
    name: str
    slug: str  # the name for file names: "nvidia-h100-80gb-hbm3"
    info: dict[str, Any]


# ---- what runs ----


def is_cuda_mark(node: ast.expr) -> bool:
    """``pytest.mark.cuda``, called or not."""
    if isinstance(node, ast.Call):
        node = node.func
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "cuda"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
    )


def cuda_tests(tests_dir: Path = TESTS_DIR) -> list[str]:
    """Node ids (``tests/...py::test_x``, or a whole file where its ``pytestmark``
    holds the marker) of every test marked ``cuda``, read from the sources, so that a
    listing needs no import of them."""
    found = []
    for path in sorted(tests_dir.rglob("test_*.py")):
        text = path.read_text()
        if "cuda" not in text:
            continue
        relative = path.relative_to(tests_dir.parent).as_posix()
        tree = ast.parse(text, filename=str(path))
        if any(_marks_module(node) for node in tree.body):
            found.append(relative)
            continue
        found += [f"{relative}::{name}" for name in _marked_tests(tree)]
    return found


def _marks_module(node: ast.stmt) -> bool:
    if not isinstance(node, ast.Assign):
        return False
    if not any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
        return False
    values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
    return any(is_cuda_mark(v) for v in values)


def _marked_tests(tree: ast.Module) -> list[str]:
    """The names (``test_x``, ``TestY::test_x``) of a module's tests marked ``cuda``,
    themselves or by their class."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    names = []
    for node in tree.body:
        if isinstance(node, functions) and any(map(is_cuda_mark, node.decorator_list)):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef):
            whole_class = any(map(is_cuda_mark, node.decorator_list))
            names += [
                f"{node.name}::{method.name}"
                for method in node.body
                if isinstance(method, functions)
                and (whole_class or any(map(is_cuda_mark, method.decorator_list)))
            ]
    return [name for name in names if name.split("::")[-1].startswith("test")]


def plan(slug: str, out: Path, model: str) -> list[Step]:
    """The steps, their files named for the device ``slug`` (no test step where no test
    is marked: pytest on no file would run the whole suite)."""
    python = sys.executable
    runs = out / "runs" / f"gpu-check-{slug}"
    tests = cuda_tests()
    files = sorted({test.split("::")[0] for test in tests})
    pytest_command = [python, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider"]
    # Compiling the kernels and the references on the CPU are most of the time: 8
    # workers share the GPU (each test sizes its own KV pool). A test that hangs fails
    # alone, so that the report is written.
    if importlib.util.find_spec("xdist"):
        pytest_command += ["-n", "8"]
    if importlib.util.find_spec("pytest_timeout"):
        pytest_command += ["--timeout", "100"]
    pytest_command += ["-v", "--tb=short", "-rfE"]
    pytest_command += [f"--junitxml={runs / 'cuda-tests.xml'}", *files]
    # The GGUF types' linear layers run on their planes (step 3): the file's blocks'
    # kernel is left to weight-only int8 rows.
    kernels_command = [python, "-m", "bench.kernels", "--batch", "1,32", "--context"]
    kernels_command += ["1024,8192", "--tokens", "1,4096", "--rows", "1,16", "--qtypes", "I8"]
    kernels_command += ["--json", str(runs / "kernels.json")]
    planes_command = [python, "-m", "bench.planes_linear", "--rows", "1,16"]
    planes_command += ["--json", str(runs / "planes-linear.json")]
    sweep_command = [*planes_command[:-1], str(runs / "planes-sweep.json"), "--sweep"]
    # --profile: the host's functions by their own time at 256 sequences, in the log.
    step_time_command = [python, "-m", "bench.step_time", "--model", model, "--profile"]
    step_time_command += ["--json", str(runs / "step-time.json")]
    throughput_command = [python, "-m", "bench.throughput", "--systems", "ours,hf-cb"]
    throughput_command += ["--model", model, "--num-requests", "64", "--timeout", "90"]
    throughput_command += ["--hf-cb-batch-tokens", "2048,8192", "--out", str(runs)]
    # Limits above what each took on an H200 (cuda tests 135 s before the vision ones,
    # kernels 14, planes 42, step time ~60, throughput 95), the sweep's cut at what is
    # left.
    steps = [Step("cuda tests", pytest_command, 200, CUDA_TESTS_ENV)] if files else []
    steps += [
        Step("kernels", kernels_command, 40),
        Step("planes linear", planes_command, 70),
        Step("planes sweep", sweep_command, 150),
        Step("step time", step_time_command, 90),
        Step("throughput", throughput_command, 130),
    ]
    # Last, where Nsight Compute is installed: one launch of the decode GEMV (Q4_0 at one
    # row) profiled in full, the report under the run's folder (what binds it: issue,
    # memory or latency; an H200's took ~40 s).
    ncu = shutil.which("ncu") or next((p for p in NCU_PATHS if Path(p).exists()), None)
    if ncu is not None:
        profile_command = [ncu, "-k", "regex:_planes", "--launch-skip", "2", "--launch-count"]
        profile_command += ["1", "--set", "full", "--log-file", str(runs / "ncu-gemv.txt")]
        profile_command += [python, "-m", "bench.planes_once"]
        steps.append(Step("gemv profile", profile_command, 90))
    return steps


def describe(steps: list[Step]) -> str:
    lines = []
    for number, step in enumerate(steps, 1):
        env = "".join(f"{k}={v} " for k, v in step.env.items())
        command = shlex.join(portable(step.command))
        lines.append(f"{number}. {step.name} (at most {step.timeout_s:.0f} s): {env}{command}")
        if step.name == "cuda tests":
            lines += [f"     {test}" for test in cuda_tests()]
    return "\n".join(lines)


# ---- the device ----


def device_slug(name: str) -> str:
    """A device's name for file names: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def detect_device() -> Device | None:
    """The first CUDA device, or None where torch sees none."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    info = {
        "name": props.name,
        "count": torch.cuda.device_count(),
        "capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
    }
    return Device(props.name, device_slug(props.name), info)


def no_gpu_message() -> str:
    import torch

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return (
        f"gpu-check needs an NVIDIA GPU, and this python ({sys.executable}, torch "
        f"{torch.__version__}, {build}) sees none: torch.cuda.is_available() is False. "
        "Run it where a GPU is, with a CUDA build of torch (make gpu-check "
        "GPU_PYTHON=python3 uses a python that has one); --dry-run lists what it runs."
    )


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


# ---- running ----


def import_path_env(link_root: Path) -> dict[str, str]:
    """PYTHONPATH for the steps: this checkout first (``bench``, ``tests``) and, where
    the python has no hetero_infer installed, a folder of links that maps it as
    pyproject.toml does (hetero_infer is a namespace package: no __init__ needed)."""
    paths = [str(REPO_ROOT)]
    if importlib.util.find_spec("hetero_infer") is None:
        package = link_root / "hetero_infer"
        package.mkdir(parents=True, exist_ok=True)
        for part in PACKAGE_PARTS:
            (package / part).symlink_to(REPO_ROOT / part, target_is_directory=True)
        paths.insert(0, str(link_root))
    existing = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join(paths + ([existing] if existing else []))}


def run_step(step: Step, env: dict[str, str], log_path: Path) -> dict[str, Any]:
    """Run ``step``, its output to the console and ``log_path``; its status and time.
    A step past its limit, or running when the check gets a SIGINT, is stopped with
    everything it started (its own process group)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"\n== {step.name}: {shlex.join(portable(step.command))}", flush=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            step.command,
            cwd=REPO_ROOT,
            env={**os.environ, **env, **step.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        try:
            # The output is copied on a thread of its own while this one waits in short
            # naps: a SIGINT is raised here within one, whichever thread the kernel hands
            # it to (a read blocked on the pipe is interrupted only in the thread that
            # takes the signal, and the step may run for minutes more).
            pump = threading.Thread(target=copy_lines, args=(proc.stdout, log), daemon=True)
            pump.start()
            deadline = started + step.timeout_s
            while pump.is_alive() and time.monotonic() < deadline:
                pump.join(0.1)
            timed_out = pump.is_alive()
            if timed_out:
                os.killpg(proc.pid, signal.SIGKILL)
                pump.join()
            returncode = proc.wait()
        except KeyboardInterrupt:  # the whole check stopped: its step with it
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    seconds = round(time.monotonic() - started, 1)
    if timed_out:
        status = f"timed out after {step.timeout_s:.0f} s"
    else:
        status = "ok" if returncode == 0 else f"failed: exit status {returncode}"
    return {"status": status, "seconds": seconds, "log": portable(log_path)}


def copy_lines(source: Any, log: Any) -> None:
    """A step's output, line by line as it comes, to the console and its log."""
    for line in source:
        sys.stdout.write(line)
        log.write(line)


def junit_summary(path: Path) -> dict[str, Any]:
    """Counts of a pytest JUnit report, and the ids of the tests that failed."""
    if not path.exists():
        return {"report": "missing"}
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors")}
    counts["skipped"] = sum(int(s.get("skipped", 0)) for s in suites)
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    failed = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return {**counts, "failed": failed}


def throughput_result(runs: Path, model: str) -> dict[str, Any] | None:
    """bench.throughput's result file, named as it names it (a folder by its name)."""
    label = Path(model).resolve().name if Path(model).exists() else model
    path = runs / f"throughput-{label}.json"
    return json.loads(path.read_text()) if path.exists() else None


def run_check(device: Device, out: Path, model: str, command: str) -> dict[str, Any]:
    """Run the steps; the summary (paths in it made relative: it is committed)."""
    steps = plan(device.slug, out, model)
    runs = out / "runs" / f"gpu-check-{device.slug}"
    shutil.rmtree(runs, ignore_errors=True)  # no earlier run's files read as this one's
    runs.mkdir(parents=True)
    summary: dict[str, Any] = {
        "command": command,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": device.info,
        "commit": checkout_commit(),
        "steps": {},
    }
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as link_root:
        env = {**import_path_env(Path(link_root)), "PYTHONUNBUFFERED": "1"}
        for step in steps:
            log_path = out / "logs" / f"gpu-check-{device.slug}-{step.name.replace(' ', '-')}.log"
            try:
                summary["steps"][step.name] = run_step(step, env, log_path)
            except KeyboardInterrupt:  # SIGINT: what ran so far is still written
                summary["steps"][step.name] = {"status": "interrupted", "log": portable(log_path)}
                break
    tests = summary["steps"].setdefault("cuda tests", {"status": "no test is marked cuda"})
    tests.update(marked=cuda_tests(), **junit_summary(runs / "cuda-tests.xml"))
    for name, file_name in RESULT_FILES.items():
        path = runs / file_name
        if path.exists():
            summary["steps"][name]["result"] = json.loads(path.read_text())
    throughput = throughput_result(runs, model)
    if throughput is not None:
        summary["steps"]["throughput"]["result"] = throughput
    summary["passed"] = all(s["status"] == "ok" for s in summary["steps"].values())
    return portable(summary)


def print_summary(summary: dict[str, Any], path: Path) -> None:
    print(f"\n{summary['device']['name']}:")
    for name, step in summary["steps"].items():
        extra = ""
        if "passed" in step:
            extra = (
                f" ({step['passed']} passed, {step['failures'] + step['errors']} failed, "
                f"{step['skipped']} skipped)"
            )
        seconds = f", {step['seconds']} s" if "seconds" in step else ""
        print(f"  {name}: {step['status']}{extra}{seconds}")
    print(f"written: {portable(path)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would run, run none")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="the results' folder")
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="bench.throughput's model (a name or a folder)"
    )
    args = parser.parse_args(argv)
    args.out = args.out.resolve()  # the steps run in the repository's root
    device = detect_device()
    if args.dry_run:
        where = f"on {device.name}" if device else "no GPU here; on one"
        slug = device.slug if device else "<device>"
        print(f"gpu-check (dry run, {where} it would run):")
        print(describe(plan(slug, args.out, args.model)))
        print(f"results: {portable(args.out / f'gpu-check-{slug}.json')}")
        return 0
    if device is None:
        print(no_gpu_message(), file=sys.stderr)
        return EXIT_NO_GPU
    # SIGINT stops the check (what ran is still written), even where it was started with
    # SIGINT ignored, as a background job of a script is: Python then leaves it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    command = ["python", "-m", "bench.gpu_check", *(sys.argv[1:] if argv is None else argv)]
    summary = run_check(device, args.out, args.model, shlex.join(command))
    path = args.out / f"gpu-check-{device.slug}.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(summary, path)
    return 0 if summary["passed"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
