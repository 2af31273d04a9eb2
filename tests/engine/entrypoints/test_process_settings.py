"""Importing the engine changes nothing about the process; the entry points apply the
process settings once."""

from __future__ import annotations

import os
import subprocess
import sys

from hetero_infer.engine.entrypoints.process_settings import (
    OPENMP_SPIN_COUNT,
    set_openmp_wait_policy,
)


def test_importing_the_engine_sets_no_environment():
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = (
        "import os; from hetero_infer.engine import LLMEngine, EngineConfig; "
        "print(os.environ.get('GOMP_SPINCOUNT'))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "None", out.stderr


def test_openmp_wait_policy_and_the_users_choice():
    environ: dict[str, str] = {}
    set_openmp_wait_policy(environ)
    assert environ == {"GOMP_SPINCOUNT": OPENMP_SPIN_COUNT}
    chosen = {"OMP_WAIT_POLICY": "PASSIVE"}
    set_openmp_wait_policy(chosen)
    assert chosen == {"OMP_WAIT_POLICY": "PASSIVE"}
    explicit = {"GOMP_SPINCOUNT": "0"}
    set_openmp_wait_policy(explicit)
    assert explicit == {"GOMP_SPINCOUNT": "0"}


def test_the_command_line_applies_them_before_torch_loads(tmp_path):
    """The one-shot CLI on a missing model: it exits with an error, after setting the
    wait policy (seen by a child of the process) and before importing torch."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = (
        "import os, sys; from hetero_infer.server import cli; "
        "assert 'torch' not in sys.modules; "
        "rc = cli.main(['--input', 'x', '--model', './missing-model']); "
        "print(rc, os.environ.get('GOMP_SPINCOUNT'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout.split() == ["2", OPENMP_SPIN_COUNT], out.stderr
