"""The kernels folder, found as the bare name ``kernels`` (a checkout on sys.path), gives
that name to the installed package that owns it: Hugging Face's, which transformers
imports from 5.25 on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def run_in_checkout(program: str, **env: str) -> subprocess.CompletedProcess[str]:
    # `-c` puts the working directory, the checkout, first on sys.path
    return subprocess.run(
        [sys.executable, "-c", program],
        cwd=CHECKOUT,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_installed_package_answers_to_the_bare_name(tmp_path):
    package = tmp_path / "kernels"
    package.mkdir()
    (package / "__init__.py").touch()
    program = "import kernels, hetero_infer.kernels as ours; print(kernels.__file__, ours.BACKENDS)"
    done = run_in_checkout(program, PYTHONPATH=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{package / '__init__.py'} ")


def test_transformers_imports_from_the_checkout():
    """With Hugging Face's kernels installed or not (transformers 5.25 requires it, and
    before 5.25 imports a package of that name to ask its version)."""
    done = run_in_checkout("import transformers.modeling_utils")
    assert done.returncode == 0, done.stderr
