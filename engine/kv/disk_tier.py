"""The disk tier's byte mover: block files written from host slots and read back into
them, under a size cap, least recently used files going first.

The cap covers the whole directory, whichever replica or model wrote its files: a
replica that finds it over the cap (its own count, refreshed from the directory when
it runs out) removes the files read or written longest ago (a read touches its file's
modification time). A write that cannot be made (a full or read-only disk, a cap smaller
than one block) is refused and logged once per cause; serving goes on from RAM and
recompute. A file that fails its checks is logged, removed and counted, never used;
one that cannot be read (an I/O error) is a miss, logged once per cause.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from hetero_infer.engine.kv.block_file import CorruptBlockFile, file_bytes, read_block, write_block
from hetero_infer.engine.kv.disk_changes import DiskChanges
from hetero_infer.engine.kv.disk_layout import ENTRY_SUFFIX, TEMP_PREFIX, DiskLayout

logger = logging.getLogger(__name__)

# A temporary file this old belongs to a writer that died (a live one renames it
# within a step): removed at start.
STALE_TEMP_SECONDS = 3600.0
# Evicting down to this share of the cap, so that each write past it does not rescan.
EVICT_TO = 0.9


@dataclass
class DiskCounters:
    bytes_written: int = 0
    bytes_read: int = 0
    write_errors: int = 0  # writes refused: no space, no permission, cap too small
    corrupt_files: int = 0  # files that failed their checks


class DiskTier:
    def __init__(self, layout: DiskLayout, capacity_bytes: int) -> None:
        self.layout = layout
        self.capacity = capacity_bytes
        self.changes = DiskChanges()  # for the KV events
        self.counters = DiskCounters()
        self._warned: set[str] = set()
        self._remove_stale_temps()
        self.used = sum(size for _, size, _ in self._entries())

    def write(
        self, group: int, block_hash: int, token_ids: tuple[int, ...], payload: memoryview
    ) -> bool:
        size = file_bytes(len(token_ids), payload.nbytes)
        if size > self.capacity:
            return self._refuse("cap", f"the cap of {self.capacity} bytes is under one block")
        if self.used + size > self.capacity:
            self._evict(size)
        path = self.layout.path(group, block_hash)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_block(path, self.layout.fingerprint, group, block_hash, token_ids, payload)
        except OSError as exc:
            return self._refuse(f"errno {exc.errno}", str(exc))
        self.used += size
        self.counters.bytes_written += size
        self.changes.written(group, block_hash, token_ids)
        return True

    def read(
        self, group: int, block_hash: int, token_ids: tuple[int, ...], into: memoryview
    ) -> bool:
        """Fill ``into`` from the block's file; False (``into`` then unusable) when the
        file is gone or fails its checks."""
        path = self.layout.path(group, block_hash)
        try:
            read_block(path, self.layout.fingerprint, group, block_hash, token_ids, into)
        except FileNotFoundError:
            return False  # removed since the lookup (another replica's eviction)
        except CorruptBlockFile as exc:
            logger.warning("KV disk tier: %s; removed, the prefix is recomputed", exc)
            self.counters.corrupt_files += 1
            if self._remove(path):
                self.changes.removed(group, block_hash)
            return False
        except OSError as exc:
            self._warn_once(f"read errno {exc.errno}", f"{exc}; the prefix is recomputed")
            return False
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        self.counters.bytes_read += file_bytes(len(token_ids), into.nbytes)
        return True

    def _refuse(self, cause: str, message: str) -> bool:
        """A write refused: counted, and logged once per cause."""
        self.counters.write_errors += 1
        self._warn_once(cause, f"{message}; blocks stay in RAM only")
        return False

    def _warn_once(self, cause: str, message: str) -> None:
        if cause not in self._warned:
            self._warned.add(cause)
            logger.warning("KV disk tier: %s (logged once)", message)

    def _entries(self) -> list[tuple[float, int, Path]]:
        """(modification time, size, path) of every entry under the directory."""
        entries = []
        for path in self.layout.root.rglob(f"*{ENTRY_SUFFIX}"):
            try:
                stat = path.stat()
            except OSError:
                continue  # removed meanwhile
            entries.append((stat.st_mtime, stat.st_size, path))
        return entries

    def _evict(self, incoming: int) -> None:
        """Remove the least recently used files until ``incoming`` bytes fit under the
        cap with room to spare (counted afresh: other replicas write here too)."""
        entries = sorted(self._entries())
        self.used = sum(size for _, size, _ in entries)
        target = EVICT_TO * self.capacity - incoming
        for _, size, path in entries:
            if self.used <= target:
                break
            if self._remove(path):
                self.used -= size
                if path.parent.parent == self.layout.folder:  # this model's: g<group>/<hash>
                    self.changes.removed(int(path.parent.name[1:]), int(path.stem, 16))

    def _remove(self, path: Path) -> bool:
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError:
            return False
        return True

    def _remove_stale_temps(self) -> None:
        if not self.layout.root.is_dir():
            return
        now = time.time()
        for path in self.layout.root.rglob(f"{TEMP_PREFIX}*"):
            try:
                if now - path.stat().st_mtime > STALE_TEMP_SECONDS:
                    path.unlink()
            except OSError:
                continue
