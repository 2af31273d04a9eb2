"""The disk tier's writer: block files written on a thread of their own, so that a step
never waits on the disk.

The step hands over a copy of each block's bytes (``submit``): a block computed into
the prefix cache as soon as it is whole, and an evicted block saved to a host slot.
The thread writes them in order (a file that exists already is skipped: the same
block may come twice, once computed and once evicted), each through a temporary file
renamed into place (block_file.py), so a process killed mid-write leaves every
finished file whole and never a torn one. What is queued is bounded: past
``max_pending_bytes`` a block is dropped (counted), not waited for. ``drain`` waits,
up to a deadline, for the queue to empty: a graceful stop calls it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

import torch
from hetero_infer.engine.kv.disk_tier import DiskTier

logger = logging.getLogger(__name__)

# A whole prompt's blocks of a small model (a 2,000-token prompt of SmolLM2 in bf16 is
# 46 MiB) fit several times over; a disk slower than the engine fills it and drops.
MAX_PENDING_BYTES = 256 * 2**20

Job = tuple[int, int, tuple[int, ...], torch.Tensor]  # group, block hash, tokens, bytes


class DiskWriter:
    def __init__(self, disk: DiskTier, max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        self.disk = disk
        self.max_pending_bytes = max_pending_bytes
        self.dropped = 0  # blocks not written: the queue was full
        self._jobs: deque[Job] = deque()
        self._pending_bytes = 0
        self._busy = False  # a job taken off the queue and not yet written
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kv-disk-writer", daemon=True)
        self._thread.start()

    def submit(
        self, group: int, block_hash: int, token_ids: tuple[int, ...], payload: torch.Tensor
    ) -> bool:
        """Queue a block's file (``payload``: its bytes, a tensor nothing else writes);
        False where the queue is full and the block is dropped."""
        size = payload.numel() * payload.element_size()
        with self._changed:
            if self._closed or self._pending_bytes + size > self.max_pending_bytes:
                self.dropped += 1
                return False
            self._jobs.append((group, block_hash, token_ids, payload))
            self._pending_bytes += size
            self._changed.notify_all()
        return True

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every queued block to be written; whether
        they all were."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def close(self, timeout: float) -> None:
        """Write what is queued, up to ``timeout`` seconds; then the thread ends (the
        rest is dropped and logged)."""
        if not self.drain(timeout):
            with self._changed:
                left = len(self._jobs)
                self.dropped += left
                self._jobs.clear()
            logger.warning("KV disk tier: stopped with %d blocks not yet written", left)
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout=max(timeout, 1.0))

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._jobs or self._closed)
                if not self._jobs:
                    return  # closed
                group, block_hash, token_ids, payload = self._jobs.popleft()
                self._busy = True
            try:
                if not self.disk.layout.exists(group, block_hash):
                    data = memoryview(payload.view(torch.uint8).reshape(-1).numpy())
                    self.disk.write(group, block_hash, token_ids, data)
            except Exception:  # the writer must outlive any one block
                logger.exception("KV disk tier: writing a block failed")
            finally:
                with self._changed:
                    self._busy = False
                    self._pending_bytes -= payload.numel() * payload.element_size()
                    self._changed.notify_all()
