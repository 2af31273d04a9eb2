"""How the CPU kernels (kernels/csrc) are built: at install time by setup.py, or on
first use by kernels/cpu_extension.py where no usable build was installed.

Plain standard library (torch is imported only to build), so that setup.py can load
this file before the package is installed. A build records what it was built for in
a JSON file beside the library: the torch version (the library links against torch's
C++ ABI), a digest of the sources (an editable install whose C++ changed must not run
the old library) and the CPU's instruction-set features (``-march=native`` code can
use any of them, so it must not run on a CPU that lacks one).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent / "csrc"
# The longest compiles first: ninja starts them in this order, and the build ends when
# the last one does (on 2 cores quantized_linear_cpu.cpp alone takes a third of it).
SOURCES = (
    "quantized_linear_cpu.cpp",
    "quantized_linear_amx.cpp",
    "quantized_linear_avx2.cpp",
    "bindings.cpp",
    "paged_attention_cpu.cpp",
    "decoder_stack_cpu.cpp",
    "sampler_cpu.cpp",
    "elementwise_cpu.cpp",
    "lora_cpu.cpp",
    "linear_cpu.cpp",
    "linear_amx.cpp",
    "prefill_attention_cpu.cpp",
    "prefill_attention_amx.cpp",
    "encoder_attention_cpu.cpp",
    "amx_tiles.cpp",
    "greedy_cpu.cpp",
    "store_kv_cpu.cpp",
    "moe_cpu.cpp",
    "quantized_pack_cpu.cpp",
    "image_resample_cpu.cpp",
    "pixel_levels_cpu.cpp",
)
# Also the Python module's name: the installed library is kernels/hetero_cpu_kernels*.so
# (hetero_infer.kernels.hetero_cpu_kernels).
EXTENSION_NAME = "hetero_cpu_kernels"
BUILD_INFO_FILE = f"{EXTENSION_NAME}.json"
# at::parallel_for is OpenMP in torch's headers: without -fopenmp every kernel runs on
# one thread (it links the libgomp torch has already loaded). -g0 undoes the -g of
# Python's own compile flags: debug info more than doubled the compile time (on 2 cores,
# 4.8 of the install's ~7 minutes; quantized_linear_cpu.cpp alone 137 s against 62), and
# profilers name the kernels' functions from the symbol table without it.
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-g0"]
LDFLAGS = ["-fopenmp"]
# /proc/cpuinfo flags that name instruction sets the compiler may use.
_ISA_PREFIXES = ("avx", "amx", "fma", "f16c", "bmi", "sse", "ssse", "popcnt", "gfni", "vaes")


def source_paths() -> list[Path]:
    return [SOURCE_DIR / name for name in SOURCES]


def in_compile_order(paths: list[str]) -> list[str]:
    """``paths`` of sources in SOURCES' order, the longest compiles first."""
    return sorted(paths, key=lambda path: SOURCES.index(Path(path).name))


def sources_digest() -> str:
    """A digest of every file in csrc (sources and headers)."""
    digest = hashlib.sha256()
    for path in sorted(SOURCE_DIR.iterdir()):
        if path.suffix in (".cpp", ".h"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cpu_features() -> set[str]:
    """The CPU's instruction-set features (empty where /proc/cpuinfo is not there)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return {f for f in line.split(":", 1)[1].split() if f.startswith(_ISA_PREFIXES)}
    except OSError:
        pass
    return set()


def build_info(torch_version: str) -> dict[str, Any]:
    return {
        "torch": torch_version,
        "sources": sources_digest(),
        "cpu_features": sorted(cpu_features()),
    }


def mismatch(info: dict[str, Any], torch_version: str) -> str | None:
    """Why a build described by ``info`` cannot run here (None: it can)."""
    if info.get("torch") != torch_version:
        return f"it was built for torch {info.get('torch')}, this is {torch_version}"
    if info.get("sources") != sources_digest():
        return "kernels/csrc changed since it was built"
    missing = set(info.get("cpu_features", ())) - cpu_features()
    if missing:
        return f"this CPU lacks {', '.join(sorted(missing))}"
    return None


# Set (to 1) by a build that compiles the kernels apart from the package install, in
# parallel with it (the Makefile: `setup.py build_ext --inplace` beside pip): the
# install then leaves them out.
KERNELS_APART_ENV = "HETERO_KERNELS_BUILT_APART"


def setup_kwargs() -> dict[str, Any]:
    """setup()'s ext_modules and cmdclass: the kernels as an extension of the package."""
    if os.environ.get(KERNELS_APART_ENV) == "1":
        return {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print(
            "warning: torch is not importable at build time, so the CPU kernels are not "
            "built now (install torch first, then this package with --no-build-isolation); "
            "they will be compiled on first use",
            file=sys.stderr,
        )
        return {}

    class BuildKernels(BuildExtension):
        """Builds the kernels, writes their build info; a failed build warns, not fails."""

        def build_extension(self, ext: Any) -> None:
            # setuptools hands the compiler the sources sorted by name, and ninja starts
            # them in that order: put the longest first again (on 2 cores the build took
            # 133 s with quantized_linear_cpu.cpp started last, 78 s with it first).
            compile_sorted = self.compiler.compile

            def compile_longest_first(sources: list[str], *args: Any, **kwargs: Any) -> Any:
                return compile_sorted(in_compile_order(sources), *args, **kwargs)

            self.compiler.compile = compile_longest_first
            try:
                super().build_extension(ext)
            finally:
                self.compiler.compile = compile_sorted

        def run(self) -> None:
            put_ninja_on_path()
            try:
                super().run()
            except Exception as exc:  # no compiler, an unsupported CPU, ...
                print(
                    f"warning: the CPU kernels did not build ({exc}); the engine runs "
                    "torch's code instead where it cannot build them on first use",
                    file=sys.stderr,
                )
                return
            for ext in self.extensions:
                library = Path(self.get_ext_fullpath(ext.name))
                info = build_info(torch.__version__)
                (library.parent / BUILD_INFO_FILE).write_text(json.dumps(info, indent=1))

    extension = CppExtension(
        name=f"hetero_infer.kernels.{EXTENSION_NAME}",
        sources=[f"kernels/csrc/{name}" for name in SOURCES],  # setup.py's folder is the cwd
        include_dirs=[str(SOURCE_DIR)],
        extra_compile_args=CFLAGS,
        extra_link_args=LDFLAGS,
    )
    return {"ext_modules": [extension], "cmdclass": {"build_ext": BuildKernels}}


def put_ninja_on_path() -> None:
    """torch drives ninja (parallel compiles); the ninja wheel carries the binary."""
    try:
        import ninja
    except ImportError:
        return  # a ninja already on PATH will do; without one torch compiles serially
    os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
