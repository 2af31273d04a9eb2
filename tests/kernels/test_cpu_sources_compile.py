"""The CPU kernels' sources compile for every x86 level they have a path for, not only
for the CPU that builds them (``-march=native``): their AVX-512, AVX512-BF16, VNNI and
AMX code sits behind preprocessor guards, so a name used outside its guard breaks the
build only on the CPUs that lack it (an AVX2-only EPYC, a Cascade Lake), where the
engine would then run without any of its kernels. A source is checked once for each
set of the guards it reads (its own and its headers') that a level turns on, leaving
out this CPU's set: the build compiled every source with that one, and the kernel
tests load what it built."""

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


GUARD = re.compile(r"defined\((__\w+__)\)")  # defined(__AVX512BW__) and the like
INCLUDE = re.compile(r'#include "([^"]+)"')


def guards_on(level: str, guards: set[str]) -> frozenset[str]:
    """Those of ``guards`` that the compiler defines at ``-march=level``."""
    run = [COMPILER, f"-march={level}", "-dM", "-E", "-x", "c++", os.devnull]
    macros = subprocess.run(run, check=True, capture_output=True, text=True).stdout.split()
    return frozenset(guards.intersection(macros))


def guards_read_by(source: Path) -> set[str]:
    """The guard macros that ``source`` and the headers of ours it includes test."""
    guards: set[str] = set()
    read: set[Path] = set()
    unread = [source]
    while unread:
        path = unread.pop()
        if path not in read:
            read.add(path)
            text = path.read_text()
            guards.update(GUARD.findall(text))
            unread += [cpu_build.SOURCE_DIR / name for name in INCLUDE.findall(text)]
    return guards


def sources_to_check() -> dict[str, list[Path]]:
    """The sources to compile at each level: a source's code differs between two levels
    only where the guards it reads do, so each source once for each set of them that a
    level turns on, except the set this CPU's build compiled. A source that reads no
    guards is never checked again; one that reads only AVX-512F's at one level."""
    read = {source: guards_read_by(source) for source in CHECKED}
    every = set().union(*read.values())
    on = {level: guards_on(level, every) for level in ["native", *LEVELS]}
    plan: dict[str, list[Path]] = {level: [] for level in LEVELS}
    for source, guards in read.items():
        compiled = {on["native"] & guards}
        for level in LEVELS:
            if (on[level] & guards) not in compiled:
                compiled.add(on[level] & guards)
                plan[level].append(source)
    return {level: sources for level, sources in plan.items() if sources}


def compile_flags(level: str) -> list[str]:
    """The build's flags (kernels/cpu_build.py) for ``level`` rather than this CPU,
    warnings off: only errors count here."""
    flags = [f"-march={level}" if f == "-march=native" else f for f in cpu_build.CFLAGS]
    includes = [*include_paths(), sysconfig.get_paths()["include"], str(cpu_build.SOURCE_DIR)]
    return ["-std=c++20", *flags, "-w", *(f"-I{path}" for path in includes)]


def syntax_errors(level: str, sources: list[Path], work: Path) -> list[str]:
    """The errors of ``sources`` at ``level``. torch's headers, which every source
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
    for source in sources:
        run = [COMPILER, *flags, "-include", "tensor_api.h", "-fsyntax-only", str(source)]
        done = subprocess.run(run, cwd=folder, capture_output=True, text=True)
        if done.returncode != 0:
            errors.append(f"{source.name} at -march={level}:\n{done.stderr[-2000:]}")
    return errors


def test_every_source_compiles_at_every_level(tmp_path: Path) -> None:
    plan = sources_to_check()
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        found = pool.map(lambda level: syntax_errors(level, plan[level], tmp_path), plan)
        errors = [error for level_errors in found for error in level_errors]
    assert not errors, "\n".join(errors)


def test_a_source_is_checked_at_the_levels_where_its_guards_differ() -> None:
    plan = sources_to_check()
    levels = {source.name: [level for level in plan if source in plan[level]] for source in CHECKED}
    # its guards and its headers': none
    assert levels["elementwise_cpu.cpp"] == []
    # AMX's tiles alone: at Sapphire Rapids, unless this CPU has them
    amx = guards_on("native", {"__AMX_TILE__"})
    assert levels["amx_tiles.cpp"] == ([] if amx else ["sapphirerapids"])
