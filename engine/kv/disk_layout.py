"""Where the disk tier keeps its files, and the block hashes' key kept beside them.

A directory serves every replica on the machine that names it, across restarts:

    DIR/hash_key                     16 random bytes, mode 0600, created once
    DIR/<fingerprint>/g<group>/<block hash>.kv

The block hashes are keyed (core/block_manager.py says why); replicas that share the
directory must hash alike to find each other's blocks, so the key lives with the
directory rather than in one process, readable by its owner only: a client that sees
neither the file nor the key cannot work out which file a prompt's blocks get. The
fingerprint (fingerprint.py) keeps one model's KV from ever being read as another's.
No torch here: the scheduler asks this whether a block is on disk.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

KEY_FILE = "hash_key"
KEY_BYTES = 16
ENTRY_SUFFIX = ".kv"
TEMP_PREFIX = ".tmp-"


def load_or_create_key(root: Path) -> bytes:
    """The directory's hash key, made on first use. Two replicas starting at once both
    write a candidate, and the first link wins: every replica reads the same key."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = root / KEY_FILE
    if not path.exists():
        candidate = root / f"{TEMP_PREFIX}key-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(candidate, path)  # atomic: fails if another replica's key is there
        except FileExistsError:
            pass
        finally:
            candidate.unlink()
    key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise ValueError(f"{path}: not a hash key ({len(key)} bytes); remove it to make one")
    return key


class DiskLayout:
    """The files of one model fingerprint under a tier directory."""

    def __init__(self, root: str | Path, fingerprint: str) -> None:
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.folder = self.root / fingerprint

    def group_folder(self, group: int) -> Path:
        return self.folder / f"g{group}"

    def path(self, group: int, block_hash: int) -> Path:
        return self.group_folder(group) / f"{block_hash:016x}{ENTRY_SUFFIX}"

    def exists(self, group: int, block_hash: int) -> bool:
        return os.path.exists(self.path(group, block_hash))
