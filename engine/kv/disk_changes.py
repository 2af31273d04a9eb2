"""The files the disk tier writes and removes, for the KV events: recorded on the disk
writer's thread (and the runner's, for a bad file), taken on the scheduler's at each
step. Only while events are on (``recording``): otherwise nothing would take them.

A removal is this replica's own: the replicas that share a directory each report what
they wrote and removed, so a file another removed stays in this one's events until a
read here finds it gone. No torch.
"""

from __future__ import annotations

from collections import deque

# (group, block hash, its tokens for a file written; None for a file removed)
DiskChange = tuple[int, int, tuple[int, ...] | None]


class DiskChanges:
    def __init__(self) -> None:
        self.recording = False
        self._changes: deque[DiskChange] = deque()  # appends and pops are thread-safe

    def written(self, group: int, block_hash: int, token_ids: tuple[int, ...]) -> None:
        if self.recording:
            self._changes.append((group, block_hash, token_ids))

    def removed(self, group: int, block_hash: int) -> None:
        if self.recording:
            self._changes.append((group, block_hash, None))

    def take(self) -> list[DiskChange]:
        taken = []
        while self._changes:
            taken.append(self._changes.popleft())
        return taken
