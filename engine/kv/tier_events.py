"""What the prefix cache's slower tiers tell the KV events (core/kv_events.py): the
blocks host RAM saves and lets go ("CPU"), the files the disk tier writes and removes
("DISK"). Made once events are on; no torch."""

from __future__ import annotations

import functools

from hetero_infer.engine.core.kv_events import MEDIUM_DISK, MEDIUM_HOST, KVEventLog
from hetero_infer.engine.kv.disk_changes import DiskChanges
from hetero_infer.engine.kv.tier_index import SlotIndex


class TierEvents:
    def __init__(
        self, events: KVEventLog, indexes: list[SlotIndex], disk_changes: DiskChanges | None
    ) -> None:
        self.events = events
        self.disk_changes = disk_changes
        for group, index in enumerate(indexes):  # a slot taken for another block
            index.on_removed = functools.partial(events.removed, group, medium=MEDIUM_HOST)
        if disk_changes is not None:
            disk_changes.recording = True

    def host_stored(self, group: int, block_hash: int, token_ids: tuple[int, ...]) -> None:
        self.events.tier_stored(group, MEDIUM_HOST, block_hash, token_ids)

    def disk_changed(self) -> None:
        """The files written and removed since the last step."""
        if self.disk_changes is None:
            return
        for group, block_hash, token_ids in self.disk_changes.take():
            if token_ids is None:
                self.events.removed(group, block_hash, MEDIUM_DISK)
            else:
                self.events.tier_stored(group, MEDIUM_DISK, block_hash, token_ids)
