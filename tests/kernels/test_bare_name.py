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
    program = "import kernels, hetero_infer.kernels as ours; print(kernels.__file__, ours.BACKENDS)"
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
    (package / "__init__.py").touch()
    done = import_bare_kernels(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{package / '__init__.py'} ")


def test_the_bare_name_never_gives_this_folder(tmp_path):
    """Hugging Face's package where it is installed (transformers 5.25 on), and where it
    is not, no package of that name."""
    done = import_bare_kernels(tmp_path)
    if done.returncode == 0:
        assert not done.stdout.startswith(str(CHECKOUT / "kernels")), done.stdout
    else:
        assert "ModuleNotFoundError: No module named 'kernels'" in done.stderr
