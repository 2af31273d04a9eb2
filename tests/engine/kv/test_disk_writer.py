"""DiskWriter: blocks written in order off the caller's thread, a bounded queue that
drops rather than waits, and a close that keeps to its deadline."""

from __future__ import annotations

import threading
import time

import torch
from hetero_infer.engine.kv.disk_writer import DiskWriter

PAYLOAD = torch.arange(16, dtype=torch.float32)  # 64 bytes


class FakeLayout:
    def __init__(self) -> None:
        self.existing: set[tuple[int, int]] = set()

    def exists(self, group: int, block_hash: int) -> bool:
        return (group, block_hash) in self.existing


class FakeDisk:
    """A disk tier whose writes wait for ``go`` and are recorded."""

    def __init__(self) -> None:
        self.layout = FakeLayout()
        self.go = threading.Event()
        self.written: list[tuple[int, int, tuple[int, ...], bytes]] = []

    def write(self, group, block_hash, token_ids, payload) -> bool:
        self.go.wait()
        self.written.append((group, block_hash, token_ids, bytes(payload)))
        self.layout.existing.add((group, block_hash))
        return True


def test_blocks_are_written_in_order_and_once():
    disk = FakeDisk()
    disk.go.set()
    writer = DiskWriter(disk)
    for block_hash in (1, 2, 1):  # the same block twice: computed, then evicted
        assert writer.submit(0, block_hash, (5, 6), PAYLOAD.clone())
    assert writer.drain(timeout=10)
    assert [(h, t) for _, h, t, _ in disk.written] == [(1, (5, 6)), (2, (5, 6))]
    assert disk.written[0][3] == PAYLOAD.numpy().tobytes()
    writer.close(timeout=1)


def test_a_full_queue_drops_instead_of_waiting():
    disk = FakeDisk()  # stuck: nothing is written until go
    writer = DiskWriter(disk, max_pending_bytes=PAYLOAD.numel() * 4)
    started = time.monotonic()
    accepted = [writer.submit(0, h, (1,), PAYLOAD.clone()) for h in range(3)]
    assert time.monotonic() - started < 1
    assert accepted == [True, False, False] and writer.dropped == 2
    disk.go.set()
    assert writer.drain(timeout=10) and len(disk.written) == 1
    assert writer.submit(0, 7, (1,), PAYLOAD.clone())  # written: its room is free again
    assert writer.drain(timeout=10) and len(disk.written) == 2
    writer.close(timeout=1)


def test_close_keeps_to_its_deadline():
    disk = FakeDisk()  # stuck on the first block
    writer = DiskWriter(disk)
    for block_hash in range(3):
        writer.submit(0, block_hash, (1,), PAYLOAD.clone())
    started = time.monotonic()
    writer.close(timeout=0.2)
    assert time.monotonic() - started < 5
    assert writer.dropped == 2  # the two still queued; the first was being written
    assert not writer.submit(0, 9, (1,), PAYLOAD.clone())  # closed
    disk.go.set()
