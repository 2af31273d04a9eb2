"""Modules stay small enough to read in one sitting: a module that outgrows its limit
holds more than one concept, and splits where its concepts part."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = {"engine": 300, "server": 400, "kernels": 450}
# The C++ kernels (kernels/csrc): a file per kernel, its shared parts in headers.
MAX_CPP_LINES = 600


@pytest.mark.parametrize("package", sorted(MAX_LINES))
def test_no_module_outgrows_its_package_limit(package: str):
    limit = MAX_LINES[package]
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in (ROOT / package).rglob("*.py")
    }
    assert sizes, f"no modules found under {package}/"
    too_long = {name: lines for name, lines in sizes.items() if lines > limit}
    assert not too_long, f"over {limit} lines: {too_long}"


def test_no_cpp_kernel_file_outgrows_the_limit():
    sizes = {
        path.name: len(path.read_text().splitlines())
        for path in (ROOT / "kernels" / "csrc").iterdir()
        if path.suffix in (".cpp", ".h")
    }
    assert sizes, "no C++ kernels found"
    too_long = {name: lines for name, lines in sizes.items() if lines > MAX_CPP_LINES}
    assert not too_long, f"over {MAX_CPP_LINES} lines: {too_long}"
