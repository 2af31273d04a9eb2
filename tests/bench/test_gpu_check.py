"""bench/gpu_check.py on a machine without a GPU: its dry run lists the tests marked
cuda and the benchmarks, a real run refuses, and the parts of a run (finding the marked
tests, a step's limit, the JUnit counts, the summary) on made-up steps; the profile
step where Nsight Compute is, and bench/planes_once.py's refusal without a GPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench import gpu_check, planes_once
from bench.gpu_check import Device, Step

REPO_ROOT = Path(__file__).resolve().parents[2]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# A line that marks a test (or a module) cuda, as a grep would find it.
MARKING_LINE = re.compile(r"^\s*(@pytest\.mark\.cuda\b|pytestmark\b.*\bpytest\.mark\.cuda\b)", re.M)


def files_with_the_marker() -> list[str]:
    return sorted(
        path.relative_to(REPO_ROOT).as_posix()
        for path in (REPO_ROOT / "tests").rglob("test_*.py")
        if MARKING_LINE.search(path.read_text())
    )


def test_the_dry_run_lists_the_cuda_tests_and_the_benchmarks():
    proc = run_module("--dry-run")
    assert proc.returncode == 0, proc.stderr
    files = files_with_the_marker()
    assert files, "no test is marked cuda"
    for file in files:
        assert f"{file}::test_" in proc.stdout or f"{file}\n" in proc.stdout, file
    assert "-m pytest -m cuda" in proc.stdout and "TRITON_INTERPRET=0" in proc.stdout
    assert "-m bench.kernels" in proc.stdout
    assert "planes linear (at most" in proc.stdout and "-m bench.planes_linear" in proc.stdout
    assert "planes sweep (at most" in proc.stdout and "--sweep" in proc.stdout
    assert "step time (at most" in proc.stdout and "-m bench.step_time" in proc.stdout
    assert "--systems ours,hf-cb" in proc.stdout  # against transformers' continuous batching
    assert "-m bench.throughput --systems ours" in proc.stdout
    assert "bench/results/gpu-check-" in proc.stdout


@no_gpu
def test_a_profile_of_the_gemv_runs_last_where_nsight_compute_is(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check.shutil, "which", lambda name: None)
    monkeypatch.setattr(gpu_check, "NCU_PATHS", ())
    assert "gemv profile" not in [step.name for step in gpu_check.plan("gpu", tmp_path, "m")]
    monkeypatch.setattr(gpu_check.shutil, "which", lambda name: f"/opt/{name}")
    last = gpu_check.plan("gpu", tmp_path, "m")[-1]
    assert last.name == "gemv profile" and last.command[0] == "/opt/ncu"
    assert last.command[-2:] == ["-m", "bench.planes_once"]
    report = last.command[last.command.index("--log-file") + 1]
    assert report == str(tmp_path / "runs" / "gpu-check-gpu" / "ncu-gemv.txt")


@no_gpu
def test_the_profiled_launches_need_a_gpu(capsys):
    assert planes_once.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_without_a_gpu_it_refuses_saying_why():
    proc = run_module()
    assert proc.returncode == gpu_check.EXIT_NO_GPU
    assert "needs an NVIDIA GPU" in proc.stderr and "--dry-run" in proc.stderr
    assert "torch.cuda.is_available() is False" in proc.stderr


def test_marked_tests_are_found_by_function_class_and_module(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_functions.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.cuda\ndef test_on_gpu(): pass\n\n"
        "@pytest.mark.slow\ndef test_on_cpu(): pass\n\n"
        "@pytest.mark.cuda()\nasync def test_called_mark(): pass\n\n"
        "@pytest.mark.cuda\nclass TestAll:\n"
        "    def test_a(self): pass\n    def not_a_test(self): pass\n\n"
        "class TestSome:\n    @pytest.mark.cuda\n    def test_b(self): pass\n"
        "    def test_c(self): pass\n"
    )
    (tests / "test_module.py").write_text(
        "import pytest\npytestmark = [pytest.mark.slow, pytest.mark.cuda]\ndef test_x(): pass\n"
    )
    (tests / "test_unmarked.py").write_text("def test_cuda_in_its_name(): pass\n")
    assert gpu_check.cuda_tests(tests) == [
        "tests/test_functions.py::test_on_gpu",
        "tests/test_functions.py::test_called_mark",
        "tests/test_functions.py::TestAll::test_a",
        "tests/test_functions.py::TestSome::test_b",
        "tests/test_module.py",
    ]


def test_device_names_become_file_names():
    assert gpu_check.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert gpu_check.device_slug("NVIDIA GeForce RTX 4090 (PCIe)") == "nvidia-geforce-rtx-4090-pcie"


def test_junit_counts_and_failures(tmp_path):
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest" tests="4" failures="1" errors="1" skipped="1">'
        '<testcase classname="tests.a" name="test_ok"/>'
        '<testcase classname="tests.a" name="test_bad"><failure message="x"/></testcase>'
        '<testcase classname="tests.b" name="test_broken"><error message="y"/></testcase>'
        '<testcase classname="tests.b" name="test_skip"><skipped message="z"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert gpu_check.junit_summary(report) == {
        "tests": 4,
        "failures": 1,
        "errors": 1,
        "skipped": 1,
        "passed": 1,
        "failed": ["tests.a::test_bad", "tests.b::test_broken"],
    }
    assert gpu_check.junit_summary(tmp_path / "absent.xml") == {"report": "missing"}


def test_a_step_past_its_limit_is_stopped_with_what_it_started(tmp_path):
    # The step starts a child that would outlive it (as bench.throughput starts its
    # workers); both go at the limit.
    pid_file = tmp_path / "child.pid"
    parent = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    step = Step("sleeper", [sys.executable, "-c", parent], timeout_s=2)
    result = gpu_check.run_step(step, {}, tmp_path / "sleeper.log")
    assert result["status"] == "timed out after 2 s"
    assert result["seconds"] < 30
    status = Path(f"/proc/{pid_file.read_text()}/status")
    for _ in range(50):  # until it is gone or a zombie (killed, not yet reaped)
        if not status.exists() or "\nState:\tZ" in status.read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail("the step's child outlived its limit")


def test_a_run_writes_one_summary_with_every_steps_results(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs" / "gpu-check-fake-gpu"
    junit = (
        '<testsuite tests="2" failures="0" errors="0" skipped="0">'
        '<testcase classname="tests.k" name="test_a"/><testcase classname="tests.k" name="test_b"/>'
        "</testsuite>"
    )
    kernels = {"device": "Fake GPU", "results": [{"kernel": "linear Q4_K", "gb_per_s": 1.0}]}

    def writes(path: Path, text: str) -> list[str]:
        return [sys.executable, "-c", f"open({str(path)!r}, 'w').write({text!r})"]

    steps = [
        Step("cuda tests", writes(runs / "cuda-tests.xml", junit), 30),
        Step("kernels", writes(runs / "kernels.json", json.dumps(kernels)), 30),
        Step("throughput", [sys.executable, "-c", "raise SystemExit(3)"], 30),
    ]
    monkeypatch.setattr(gpu_check, "plan", lambda slug, out, model: steps)
    fake = Device("Fake GPU", "fake-gpu", {"name": "Fake GPU", "count": 1})
    monkeypatch.setattr(gpu_check, "detect_device", lambda: fake)

    assert gpu_check.main(["--out", str(tmp_path)]) == gpu_check.EXIT_FAILED
    summary = json.loads((tmp_path / "gpu-check-fake-gpu.json").read_text())
    tests = summary["steps"]["cuda tests"]
    assert tests["status"] == "ok" and (tests["passed"], tests["failures"]) == (2, 0)
    assert tests["marked"] == gpu_check.cuda_tests()
    assert summary["steps"]["kernels"]["result"] == kernels
    assert summary["steps"]["throughput"]["status"] == "failed: exit status 3"
    assert summary["device"]["name"] == "Fake GPU" and summary["passed"] is False
    assert (tmp_path / "logs" / "gpu-check-fake-gpu-throughput.log").exists()
    assert "cuda tests: ok (2 passed, 0 failed, 0 skipped)" in capsys.readouterr().out


# The check in a python of its own, as `timeout -s INT` runs it; started with SIGINT
# ignored (as `make test &` in a script starts pytest, whose children inherit it), which
# the check must undo.
INTERRUPTED_CHECK = """
import json, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a script starts
from pathlib import Path
from bench import gpu_check
from bench.gpu_check import Device, Step
out = Path(sys.argv[1])
runs = out / "runs" / "gpu-check-fake-gpu"
kernels = {"device": "Fake GPU", "results": []}
interrupt = "import os, signal, time; os.kill(os.getppid(), signal.SIGINT); time.sleep(30)"
write = f"open({str(runs / 'kernels.json')!r}, 'w').write({json.dumps(kernels)!r})"
gpu_check.plan = lambda slug, out, model: [
    Step("kernels", [sys.executable, "-c", write], 30),
    Step("step time", [sys.executable, "-c", interrupt], 30),
    Step("throughput", [sys.executable, "-c", "pass"], 30),
]
gpu_check.detect_device = lambda: Device("Fake GPU", "fake-gpu", {"name": "Fake GPU", "count": 1})
sys.exit(gpu_check.main(["--out", str(out)]))
"""


def test_an_interrupted_run_still_writes_what_ran(tmp_path):
    """SIGINT (``timeout -s INT`` around the check) stops the step running and the rest;
    the summary keeps the steps before it."""
    started = time.monotonic()
    check = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_CHECK, str(tmp_path)],
        cwd=Path(gpu_check.__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == gpu_check.EXIT_FAILED, check.stdout + check.stderr
    assert time.monotonic() - started < 20  # the sleeping step was stopped
    summary = json.loads((tmp_path / "gpu-check-fake-gpu.json").read_text())
    assert summary["steps"]["kernels"]["result"] == {"device": "Fake GPU", "results": []}
    assert summary["steps"]["step time"]["status"] == "interrupted"
    assert "throughput" not in summary["steps"]


def test_without_an_installed_package_the_steps_import_this_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: None)
    env = gpu_check.import_path_env(tmp_path)
    assert env["PYTHONPATH"].split(":")[:2] == [str(tmp_path), str(REPO_ROOT)]
    for part in gpu_check.PACKAGE_PARTS:
        assert (tmp_path / "hetero_infer" / part).resolve() == REPO_ROOT / part
