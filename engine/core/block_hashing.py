"""The prefix cache's block hashes: each full block of tokens hashed chained to the
blocks before it, with the images whose placeholder tokens it holds.

The hashes are keyed with a random key per block manager (so per process and replica),
or the key a disk tier's directory keeps for its replicas (kv/disk_layout.py). Python's
hash of a tuple of ints is the same in every process: unkeyed, anyone could work out
offline which hash a prompt's blocks get, and craft blocks that collide with another
tenant's (the token comparison on a hit keeps a collision from serving wrong KV, but a
colliding block registered first keeps the victim's out of the cache).
"""

from __future__ import annotations

import hashlib
import secrets
from array import array
from collections.abc import Sequence as Seq

from hetero_infer.engine.core.sequence import Sequence


class BlockHasher:
    def __init__(self, key: bytes | None = None) -> None:
        self.key = key or secrets.token_bytes(16)

    def hash_block(
        self, parent: int | None, token_ids: Seq[int], image_hashes: Seq[int] = ()
    ) -> int:
        """The keyed hash of one full block of tokens chained to its parent block's hash
        (None for a sequence's first block), and the content hashes of the images whose
        placeholder tokens it holds: a 64-bit keyed BLAKE2b, about 1 us a block."""
        data = array("q", token_ids).tobytes()
        if parent is not None:  # 8 more bytes: a first block never reads as a later one
            data += parent.to_bytes(8, "little")
        data += array("Q", image_hashes).tobytes()  # 8 bytes an image
        digest = hashlib.blake2b(data, digest_size=8, key=self.key).digest()
        return int.from_bytes(digest, "little")

    def block_hashes(self, seq: Sequence, block_size: int, num_full_blocks: int) -> list[int]:
        """Chained hashes of the sequence's first full blocks (cached on the sequence)."""
        hashes: list[int] = seq.block_hashes
        bs = block_size
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else seq.hash_salt  # LongRoPE's, an adapter's
            images = [image.content_hash for image in seq.images_in(i * bs, (i + 1) * bs)]
            hashes.append(self.hash_block(parent, seq.token_ids[i * bs : (i + 1) * bs], images))
        return hashes[:num_full_blocks]
