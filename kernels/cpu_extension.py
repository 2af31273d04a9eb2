"""The CPU kernels in kernels/csrc, compiled on first use.

torch's cpp_extension builds them with the machine's own compiler and flags (-O3
-march=native: they run where they are built) and keeps the library under
TORCH_EXTENSIONS_DIR, so only the first process on a machine pays the build (about a
minute on 2 cores); later ones load it in well under a second. Where the build fails
(no compiler, no ninja) a warning says so once and the torch code runs instead, with
the same results, more slowly. ``HETERO_CPU_KERNELS=0`` turns the kernels off.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

SOURCES = [
    Path(__file__).parent / "csrc" / name
    for name in (
        "bindings.cpp",
        "paged_attention_cpu.cpp",
        "prefill_attention_cpu.cpp",
        "elementwise_cpu.cpp",
        "linear_cpu.cpp",
        "greedy_cpu.cpp",
    )
]
# The elementwise kernels serve the reduced-precision dtypes only: fp32 runs the torch
# references, whose rounding matches transformers' exactly.
ELEMENTWISE_DTYPES = (torch.bfloat16, torch.float16)


@functools.cache
def cpu_kernels() -> ModuleType | None:
    """The compiled extension, or None where it cannot be built (or is turned off)."""
    if os.environ.get("HETERO_CPU_KERNELS", "1") == "0":
        return None
    try:
        import ninja  # the build tool torch drives; its wheel carries the binary

        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    except ImportError:
        pass  # a ninja already on PATH will do
    from torch.utils import cpp_extension

    started = time.perf_counter()
    try:
        module = cpp_extension.load(
            name="hetero_cpu_kernels",
            sources=[str(path) for path in SOURCES],
            # at::parallel_for is OpenMP in torch's headers: without -fopenmp every kernel
            # runs on one thread (it links the libgomp torch has already loaded).
            extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            extra_include_paths=[str(SOURCES[0].parent)],
        )
    except Exception as exc:  # no compiler, no ninja, ...: slower, not broken
        logger.warning("CPU kernels unavailable, running torch ops instead: %s", exc)
        return None
    logger.info("CPU kernels ready in %.1f s", time.perf_counter() - started)
    return module


def elementwise_kernels(x: torch.Tensor) -> ModuleType | None:
    """The extension where it serves tensor ``x`` (a CPU tensor in bf16 or fp16)."""
    if not x.is_cpu or x.dtype not in ELEMENTWISE_DTYPES:
        return None
    return cpu_kernels()
