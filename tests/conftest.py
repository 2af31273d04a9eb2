"""Shared pytest set-up: the cuda marker skips without a GPU; the cpu_kernels marker
skips where a C++ CPU kernel that needs an ISA extension does not run, saying which
features this CPU lacks (kernels/cpu_isa.py decides, as the engine does)."""

from __future__ import annotations

import importlib.util
import os

# Triton's kernels run on CPU tensors in its interpreter (tests/kernels). The knob must be
# on before triton is first imported, by anything: triton decorates its own library
# (tl.zeros, tl.sum, ...) at import, and what it decorated compiled is never interpreted.
# A run that sets TRITON_INTERPRET=0 itself keeps the compiled kernels: the GPU check
# (bench/gpu_check.py) runs the tests marked ``cuda`` that way.
if os.environ.get("TRITON_INTERPRET") != "0":
    os.environ["TRITON_INTERPRET"] = "1"

from hetero_infer.engine.entrypoints.process_settings import set_openmp_wait_policy  # noqa: E402

# Before torch loads. `make test`'s workers (pytest-xdist) share the cores: each takes
# its share of them for torch's threads (an OMP_NUM_THREADS set before wins; the kernel
# tests set their own counts), where two threads each kept the two workers waiting on
# each other; and OpenMP threads spin only briefly between parallel regions, as the
# engine's entry points have them do (engine/entrypoints/process_settings.py).
if workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(workers))))
set_openmp_wait_policy()

from collections.abc import Iterable  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hetero_infer.kernels import cpu_isa  # noqa: E402

if os.environ["TRITON_INTERPRET"] == "1" and importlib.util.find_spec("triton"):
    from tests.triton_interpreter import patch_helper_modules_once

    patch_helper_modules_once()


def pytest_report_header(config: pytest.Config) -> str:
    return cpu_isa.describe()


def cpu_kernels_skip(markers: Iterable[pytest.Mark]) -> str | None:
    """Why a test's ``cpu_kernels(name, ...)`` marks do not hold here (None: they do)."""
    for marker in markers:
        for kernel in marker.args:
            reason = cpu_isa.kernel_unavailable(kernel)
            if reason is not None:
                return reason
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        reason = cpu_kernels_skip(item.iter_markers("cpu_kernels"))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
    # The files with slow tests first: `make test`'s workers take whole files in this
    # order, and a long file taken last leaves one worker running it alone at the end.
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
