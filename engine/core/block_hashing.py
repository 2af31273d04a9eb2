"""The prefix cache's block hashes: each full block of tokens hashed chained to the
blocks before it, with the images whose placeholder tokens it holds. Ours (keyed, the
default) or vLLM's ``sha256_cbor`` (EngineConfig.prefix_caching_hash_algo).

The hashes are keyed with a random key per block manager (so per process and replica),
or the key a disk tier's directory keeps for its replicas (kv/disk_layout.py). Python's
hash of a tuple of ints is the same in every process: unkeyed, anyone could work out
offline which hash a prompt's blocks get, and craft blocks that collide with another
tenant's (the token comparison on a hit keeps a collision from serving wrong KV, but a
colliding block registered first keeps the victim's out of the cache).
"""

from __future__ import annotations

import abc
import hashlib
import os
import secrets
from array import array
from collections.abc import Sequence as Seq

import cbor2
from hetero_infer.engine.core.sequence import Sequence


class BlockHasher(abc.ABC):
    """Chained hashes of a sequence's full blocks: each block's from its parent's, its
    tokens and the content hashes of the images whose placeholder tokens it holds."""

    @abc.abstractmethod
    def hash_block(
        self, parent: int | None, token_ids: Seq[int], image_hashes: Seq[int] = ()
    ) -> int:
        """A full block chained to its parent block's hash."""

    @abc.abstractmethod
    def first_block(self, salt: int | None, token_ids: Seq[int], image_hashes: Seq[int]) -> int:
        """A sequence's first block, with the sequence's salt (Sequence.hash_salt)."""

    def block_hashes(self, seq: Sequence, block_size: int, num_full_blocks: int) -> list[int]:
        """Chained hashes of the sequence's first full blocks (cached on the sequence)."""
        hashes: list[int] = seq.block_hashes
        bs = block_size
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            tokens = seq.token_ids[i * bs : (i + 1) * bs]
            images = [image.content_hash for image in seq.images_in(i * bs, (i + 1) * bs)]
            if hashes:
                hashes.append(self.hash_block(hashes[-1], tokens, images))
            else:  # LongRoPE's, an adapter's or a cache_salt's
                hashes.append(self.first_block(seq.hash_salt, tokens, images))
        return hashes[:num_full_blocks]


class KeyedBlockHasher(BlockHasher):
    """Ours: a 64-bit keyed BLAKE2b, about 1 us a block."""

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key or secrets.token_bytes(16)

    def hash_block(
        self, parent: int | None, token_ids: Seq[int], image_hashes: Seq[int] = ()
    ) -> int:
        """The keyed hash of one full block of tokens chained to its parent block's hash
        (None for a sequence's first block without a salt)."""
        data = array("q", token_ids).tobytes()
        if parent is not None:  # 8 more bytes: a first block never reads as a later one
            data += parent.to_bytes(8, "little")
        data += array("Q", image_hashes).tobytes()  # 8 bytes an image
        digest = hashlib.blake2b(data, digest_size=8, key=self.key).digest()
        return int.from_bytes(digest, "little")

    def first_block(self, salt: int | None, token_ids: Seq[int], image_hashes: Seq[int]) -> int:
        return self.hash_block(salt, token_ids, image_hashes)  # the salt stands as parent


class Sha256CborBlockHasher(BlockHasher):
    """vLLM's ``sha256_cbor``, for routers that recompute a prompt's block hashes to
    find the replica that holds it (llm-d's precise prefix-cache scorer, Dynamo's KV
    router): a block's hash is the SHA-256 of the canonical CBOR of (its parent's hash,
    its token ids, its extra keys or None), a first block's parent the hash of
    PYTHONHASHSEED's value (random where it is unset, as vLLM's: then no one else can
    compute them). Extra keys here: the images' content hashes, and on a first block
    the sequence's salt. Kept whole as ints (256 bits).

    Unkeyed by design, so that routers can compute them: anyone can, and may craft a
    colliding block (the token comparison on a hit still keeps it from serving wrong
    KV), which is why ours stays the default."""

    def __init__(self, seed: str | None = None) -> None:
        self.none_hash = os.urandom(32) if seed is None else sha256_cbor(seed)

    def hash_block(
        self, parent: int | None, token_ids: Seq[int], image_hashes: Seq[int] = ()
    ) -> int:
        parent_hash = self.none_hash if parent is None else parent.to_bytes(32, "big")
        extra_keys = tuple(image_hashes) or None
        return int.from_bytes(sha256_cbor((parent_hash, tuple(token_ids), extra_keys)), "big")

    def first_block(self, salt: int | None, token_ids: Seq[int], image_hashes: Seq[int]) -> int:
        extra_keys = [*image_hashes, *([] if salt is None else [salt])]
        return self.hash_block(None, token_ids, extra_keys)


def sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def block_hasher(algo: str, key: bytes | None = None, seed: str | None = None) -> BlockHasher:
    """The hasher EngineConfig.prefix_caching_hash_algo names: the keyed one with ``key``
    (a disk tier's directory keeps one for its replicas), or sha256_cbor from ``seed``
    (PYTHONHASHSEED's value, which the entry point reads)."""
    if algo == "sha256_cbor":
        return Sha256CborBlockHasher(seed)
    return KeyedBlockHasher(key)
