"""Shared pytest set-up: the cuda marker skips without a GPU; the cpu_kernels marker
skips where a C++ CPU kernel that needs an ISA extension does not run, saying which
features this CPU lacks (kernels/cpu_isa.py decides, as the engine does)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch
from hetero_infer.kernels import cpu_isa


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
