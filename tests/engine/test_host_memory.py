"""The CPU KV cache on transparent huge pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from engine.host_memory import HUGE_PAGE, zeros_on_huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_kb_in(start: int, end: int) -> int:
    """AnonHugePages (kB) of this process's mappings that overlap [start, end)."""
    total, overlaps = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if m := re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line):
            lo, hi = int(m[1], 16), int(m[2], 16)
            overlaps = lo < end and hi > start
        elif overlaps and line.startswith("AnonHugePages:"):
            total += int(line.split()[1])
    return total


def test_zeroed_with_shape_and_dtype():
    cache = zeros_on_huge_pages((2, 3, 5, 16, 2, 8), torch.bfloat16)
    assert cache.shape == (2, 3, 5, 16, 2, 8) and cache.dtype == torch.bfloat16
    assert cache.is_contiguous() and not cache.any()
    assert zeros_on_huge_pages((0, 4), torch.float32).shape == (0, 4)


@pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages"
)
def test_large_cache_gets_huge_pages():
    cache = zeros_on_huge_pages((16 * HUGE_PAGE // 2,), torch.bfloat16)  # 16 huge pages
    start = cache.data_ptr()
    assert huge_kb_in(start, start + cache.numel() * 2) >= 8 * HUGE_PAGE // 1024
