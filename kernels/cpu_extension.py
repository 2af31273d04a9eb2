"""The CPU kernels in kernels/csrc: built at install time, or compiled on first use.

``pip install`` (``make install``) compiles them into the package for the installing
machine (see kernels/cpu_build.py); they load here in well under a second. Where no
usable build was installed (torch was not importable at build time, the sources or
torch changed since, or this CPU lacks an instruction the build used), torch's
cpp_extension compiles them on first use, keeping the library under
TORCH_EXTENSIONS_DIR, so only the first process on a machine pays (about two minutes on
2 cores). Where that fails too (no compiler) a warning says so once and the torch code
runs instead, with the same results, more slowly. Whether to use them at all is the
engine's setting (``cpu_kernels``), passed to kernels/selection.py, which loads them
only where they are wanted.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import time
from types import ModuleType

import torch
from hetero_infer.kernels import cpu_build

logger = logging.getLogger(__name__)


# Cached: a process loads (or compiles) the extension once, whoever asks first.
@functools.cache
def load_cpu_kernels() -> ModuleType | None:
    """The compiled extension, or None where it cannot be built."""
    started = time.perf_counter()
    module = _installed_build() or _build_now()
    if module is not None:
        logger.info("CPU kernels ready in %.1f s", time.perf_counter() - started)
    return module


def built_cpu_kernels() -> ModuleType | None:
    """The extension where it is built already (loaded by this process, or installed),
    without compiling it: for work that may run on a CPU when the engine does not (an
    image's resize), and must not wait minutes for a compile."""
    if load_cpu_kernels.cache_info().currsize:
        return load_cpu_kernels()
    return _installed_build()


@functools.cache
def _installed_build() -> ModuleType | None:
    """The library built at install time, where it fits this torch, source and CPU."""
    info_path = cpu_build.SOURCE_DIR.parent / cpu_build.BUILD_INFO_FILE
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError):
        return None  # not built at install time
    reason = cpu_build.mismatch(info, torch.__version__)
    if reason is not None:
        logger.warning("the CPU kernels built at install time do not fit: %s", reason)
        return None
    try:
        return importlib.import_module(f"hetero_infer.kernels.{cpu_build.EXTENSION_NAME}")
    except ImportError as exc:
        logger.warning("the CPU kernels built at install time do not load: %s", exc)
        return None


def _build_now() -> ModuleType | None:
    cpu_build.put_ninja_on_path()
    from torch.utils import cpp_extension

    logger.info("compiling the CPU kernels (once per machine; a few minutes)")
    try:
        return cpp_extension.load(
            name=cpu_build.EXTENSION_NAME,
            sources=[str(path) for path in cpu_build.source_paths()],
            extra_cflags=cpu_build.CFLAGS,
            extra_ldflags=cpu_build.LDFLAGS,
            extra_include_paths=[str(cpu_build.SOURCE_DIR)],
        )
    except Exception as exc:  # no compiler, no ninja, ...: slower, not broken
        logger.warning("CPU kernels unavailable, running torch ops instead: %s", exc)
        return None
