"""The build installs every package of the source tree under the one import name, with
every file the code reads beside itself."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_installed():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = setuptools["package-dir"]
    found = set()
    for name, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    assert set(setuptools["packages"]) == found


def test_the_build_ships_every_file_of_the_packages(tmp_path):
    """Each tracked file in the package folders (the chat page, the families' chat
    templates, the kernels' sources) is in what an install copies (package-data): an
    editable install reads the checkout and would not notice one left out."""
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tracked = subprocess.run(
        ["git", "ls-files", *setuptools["package-dir"].values()],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    missing = []
    for name, folder in setuptools["package-dir"].items():
        built = tmp_path.joinpath(*name.split("."))
        data = [p for p in tracked if p.startswith(folder + "/") and not p.endswith(".py")]
        missing += [p for p in data if not (built / p[len(folder) + 1 :]).is_file()]
    assert not missing, f"not in the installed package (pyproject's package-data): {missing}"
