"""The kernels folder, found as the bare name ``kernels`` (a checkout on sys.path), gives
that name to the installed package that owns it: Hugging Face's, which transformers
imports from 5.25 on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def import_bare_kernels(extra_path: Path) -> subprocess.CompletedProcess[str]:
    # `-c` puts the working directory, the checkout, first on sys.path
    program = "import kernels, hetero_infer.kernels as ours; print(kernels.OWNER, ours.BACKENDS)"
    return subprocess.run(
        [sys.executable, "-c", program],
        cwd=CHECKOUT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(extra_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_installed_package_answers_to_the_bare_name(tmp_path):
    package = tmp_path / "kernels"
    package.mkdir()
    (package / "__init__.py").write_text("OWNER = 'the installed kernels'\n")
    done = import_bare_kernels(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("the installed kernels ")


def test_without_such_a_package_the_bare_name_is_missing(tmp_path):
    done = import_bare_kernels(tmp_path)
    assert done.returncode != 0
    assert "ModuleNotFoundError: No module named 'kernels'" in done.stderr
