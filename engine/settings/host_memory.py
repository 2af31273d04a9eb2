"""Host memory for the CPU path: the KV cache on transparent huge pages, and a malloc
that keeps the step's freed activations for the next step.

A sequence's blocks lie anywhere in the cache, so the CPU attention kernel jumps
between blocks of a few KB; with 4 KB pages nearly every block costs a TLB miss. On
2 MB pages the kernel read the cache about 15% faster. Linux gives them to memory
that asks (``madvise``) when transparent huge pages are set to "madvise", as here;
elsewhere the request is ignored and ordinary pages serve.
"""

from __future__ import annotations

import ctypes
import logging
import math
import mmap
import os
import sys
from typing import Any

import torch

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
# glibc's mallopt parameters (malloc.h), and its largest mmap threshold on 64-bit.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor in an anonymous mapping of its own, starting on a 2 MB
    boundary, its whole 2 MB pages asked for as huge pages.

    Nothing is written up front: the kernel hands out a mapping's pages zeroed when they
    are first touched (as huge pages, where advised). Zeroing the default 2 GiB cache
    took 0.3 s of every start and made all of it resident at once; now the blocks the
    cache hands out come in as they are first written.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0 or not hasattr(mmap, "MAP_PRIVATE"):  # Windows' mmap takes no flags
        return torch.zeros(shape, dtype=dtype)
    # Private: a shared anonymous mapping (mmap's default) is shmem, whose huge pages
    # Linux governs apart (shmem_enabled, "never" by default), and a child would share it.
    # Its size leaves room to start on a huge page's boundary.
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive
    offset = -memory.data_ptr() % HUGE_PAGE
    length = nbytes // HUGE_PAGE * HUGE_PAGE
    if length and hasattr(mmap, "MADV_HUGEPAGE"):  # Linux
        try:
            mapping.madvise(mmap.MADV_HUGEPAGE, offset, length)
        except OSError as exc:
            logger.debug("madvise(MADV_HUGEPAGE) refused: %s", exc)
    return memory[offset : offset + nbytes].view(dtype).view(shape)


def gather_on_huge_pages(holders: list[Any]) -> None:
    """Moves each holder's ``packed`` weight (a CPU tensor) into one buffer on huge
    pages, in the order given, and points the holder at its part.

    A decode step streams every weight once: on 2 MB pages the quantized kernel read
    5-10% faster than on 4 KB pages (fewer TLB misses), and most of a small model's
    weights are below 2 MB each, so only a shared buffer gets them huge pages. Laid out
    in the order the step reads them, one weight's end runs into the next one's start.
    """
    align = 64  # a cache line: each weight starts on one, as the kernels' loads like
    offsets, total = [], 0
    for holder in holders:
        offsets.append(total)
        total += -(-holder.packed.nbytes // align) * align
    if total == 0:
        return
    buffer = zeros_on_huge_pages((total,), torch.uint8)
    for holder, offset in zip(holders, offsets, strict=True):
        packed = holder.packed
        part = buffer[offset : offset + packed.nbytes].view(packed.dtype).view(packed.shape)
        holder.packed = part.copy_(packed)


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks of up to 32 MB for reuse instead of giving
    them back to the kernel; True where that was set.

    A step allocates activations of up to tens of MB and frees them. By default glibc
    serves the large ones with fresh mmaps and trims the top of its heap, so every step
    faults the same pages in again: 840k page faults in an offline SmolLM2 run, and
    82k with this, which made the run 4% faster. The memory kept is about one step's
    activations. Left alone where MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ is
    set (the user chose) or the C library has no mallopt.
    """
    if not sys.platform.startswith("linux"):
        return False
    if {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"} & set(os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    # Setting the mmap threshold also fixes it (glibc otherwise moves it as it goes);
    # a trim threshold of the largest int means: never trim.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(
        mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    )


def release_freed_memory() -> None:
    """Give the memory malloc holds free back to the kernel, once (glibc's malloc_trim).

    Loading leaves the checkpoint's temporaries freed but held (keep_freed_memory means
    they are never trimmed): the embedded SmolLM2 kept quantized held ~170 MB that
    way, more than its weights. Where the C library has no malloc_trim, nothing happens.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim(0)


# Where a container's memory limit is (cgroup v2): "max" where there is none.
CGROUP_MEMORY_MAX = "/sys/fs/cgroup/memory.max"


def memory_limit() -> int:
    """The bytes of memory this process can have: the machine's, or its container's
    limit where that is lower (a Kubernetes pod's, which kills what goes past it)."""
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open(CGROUP_MEMORY_MAX) as limit:
            text = limit.read().strip()
    except OSError:
        return machine
    return min(machine, int(text)) if text.isdigit() else machine
