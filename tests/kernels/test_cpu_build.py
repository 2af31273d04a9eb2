"""The CPU kernels are built when the package installs (setup.py), and that build is the
one that loads, unless it no longer fits this torch, these sources or this CPU."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from hetero_infer.kernels import cpu_build
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from setuptools import Distribution
from torch.utils import cpp_extension

BUILD_INFO = cpu_build.SOURCE_DIR.parent / cpu_build.BUILD_INFO_FILE


def test_the_install_built_the_kernels_and_they_load():
    """`make install` built them, so the first start compiles nothing."""
    assert BUILD_INFO.is_file(), "the install did not build the CPU kernels (see setup.py)"
    info = json.loads(BUILD_INFO.read_text())
    assert cpu_build.mismatch(info, torch.__version__) is None
    module = load_cpu_kernels()
    assert module is not None
    assert Path(module.__file__).parent == BUILD_INFO.parent
    assert module.__name__ == f"hetero_infer.kernels.{cpu_build.EXTENSION_NAME}"


def test_a_build_that_does_not_fit_is_not_used():
    info = cpu_build.build_info(torch.__version__)
    assert cpu_build.mismatch(info, torch.__version__) is None
    assert "this is 0.0" in cpu_build.mismatch(info, "0.0")
    changed = {**info, "sources": "0" * 64}
    assert "changed" in cpu_build.mismatch(changed, torch.__version__)
    other_cpu = {**info, "cpu_features": [*info["cpu_features"], "avx1024_imaginary"]}
    assert "avx1024_imaginary" in cpu_build.mismatch(other_cpu, torch.__version__)


def test_sources_digest_covers_every_source_and_header():
    names = {p.name for p in cpu_build.SOURCE_DIR.iterdir() if p.suffix in (".cpp", ".h")}
    assert set(cpu_build.SOURCES) <= names
    assert any(name.endswith(".h") for name in names)
    assert len(cpu_build.sources_digest()) == 64


def test_the_build_compiles_the_longest_sources_first(tmp_path, monkeypatch):
    """ninja starts the compiles in the order torch writes them into its build file:
    SOURCES' order, though setuptools sorts them by name on the way."""
    given = []

    def write_ninja_file_and_compile(sources: list[str], **kwargs) -> None:
        given.extend(sources)
        raise RuntimeError("not compiled here")  # the build then warns and stops

    monkeypatch.setattr(
        cpp_extension, "_write_ninja_file_and_compile_objects", write_ninja_file_and_compile
    )
    kwargs = cpu_build.setup_kwargs()
    command = kwargs["cmdclass"]["build_ext"](Distribution({"ext_modules": kwargs["ext_modules"]}))
    command.ensure_finalized()
    command.build_temp, command.build_lib = str(tmp_path / "temp"), str(tmp_path / "lib")
    command.force = True  # whether or not the install's library is up to date
    command.run()
    assert [Path(source).name for source in given] == list(cpu_build.SOURCES)
