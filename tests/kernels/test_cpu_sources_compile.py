"""The CPU kernels' sources compile for every x86 level they have a path for, not only
for the CPU that builds them (``-march=native``): their AVX-512, AVX512-BF16, VNNI and
AMX code sits behind preprocessor guards, so a name used outside its guard breaks the
build only on the CPUs that lack it (an AVX2-only EPYC, a Cascade Lake), where the
engine would then run without any of its kernels. The level whose guards are this
CPU's is left out: the build compiled every source with them, and the kernel tests
load what it built."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hetero_infer.kernels import cpu_build
from torch.utils.cpp_extension import include_paths

# -march levels, one for each set of guards that can be on together.
LEVELS = {
    "x86-64-v3": "AVX2 and FMA, no AVX-512 (EPYC before Zen 4)",
    "cascadelake": "AVX-512 with VNNI, without BF16",
    "cooperlake": "AVX512-BF16 without AMX (as Zen 4)",
    "sapphirerapids": "AMX",
}
COMPILER = os.environ.get("CXX", "c++")
# bindings.cpp only declares the kernels to Python (no code behind a guard; the headers
# it includes are the other sources' too), and parsing torch's Python headers takes
# about as long as all the other sources together.
CHECKED = [path for path in cpu_build.source_paths() if path.name != "bindings.cpp"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the levels are x86's"),
    pytest.mark.skipif(shutil.which(COMPILER) is None, reason=f"no {COMPILER} to compile with"),
]


def guards_on(level: str, guards: set[str]) -> frozenset[str]:
    """Those of ``guards`` that the compiler defines at ``-march=level``."""
    run = [COMPILER, f"-march={level}", "-dM", "-E", "-x", "c++", os.devnull]
    macros = subprocess.run(run, check=True, capture_output=True, text=True).stdout.split()
    return frozenset(guards.intersection(macros))


def compile_flags(level: str) -> list[str]:
    """The build's flags (kernels/cpu_build.py) for ``level`` rather than this CPU,
    warnings off: only errors count here."""
    flags = [f"-march={level}" if f == "-march=native" else f for f in cpu_build.CFLAGS]
    includes = [*include_paths(), sysconfig.get_paths()["include"], str(cpu_build.SOURCE_DIR)]
    return ["-std=c++20", *flags, "-w", *(f"-I{path}" for path in includes)]


def syntax_errors(level: str, work: Path) -> list[str]:
    """Each checked source's errors at ``level``. torch's headers, which every source
    reads first (kernels/csrc/tensor_api.h), are parsed once into a precompiled header
    in a folder of ``work`` (the compiler takes it for the -include it finds there):
    ~0.5 s a source rather than ~3."""
    folder = work / level
    folder.mkdir()
    flags = compile_flags(level)
    header = cpu_build.SOURCE_DIR / "tensor_api.h"
    precompiled = folder / "tensor_api.h.gch"
    run = [COMPILER, *flags, "-x", "c++-header", str(header), "-o", str(precompiled)]
    subprocess.run(run, check=True, capture_output=True)
    errors = []
    for source in CHECKED:
        run = [COMPILER, *flags, "-include", "tensor_api.h", "-fsyntax-only", str(source)]
        done = subprocess.run(run, cwd=folder, capture_output=True, text=True)
        if done.returncode != 0:
            errors.append(f"{source.name} at -march={level}:\n{done.stderr[-2000:]}")
    return errors


def test_every_source_compiles_at_every_level(tmp_path: Path) -> None:
    # the sources' guard macros: defined(__AVX512BW__) and the like
    sources = "".join(path.read_text() for path in cpu_build.SOURCE_DIR.iterdir())
    guards = set(re.findall(r"defined\((__\w+__)\)", sources))
    native = guards_on("native", guards)
    levels = [level for level in LEVELS if guards_on(level, guards) != native]
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        found = pool.map(lambda level: syntax_errors(level, tmp_path), levels)
        errors = [error for level_errors in found for error in level_errors]
    assert not errors, "\n".join(errors)
