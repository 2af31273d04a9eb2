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
from typing import Any

import cbor2
from hetero_infer.engine.core.sequence import Sequence


class BlockHasher(abc.ABC):
    """Chained hashes of a sequence's full blocks: each block's from its parent's, its
    tokens and the content hashes of the images whose placeholder tokens it holds, and
    what keeps the sequence's KV apart from other KV of the same tokens (its salts)."""

    @abc.abstractmethod
    def hash_block(
        self, parent: int | None, token_ids: Seq[int], image_hashes: Seq[int] = ()
    ) -> int:
        """A full block chained to its parent block's hash."""

    @abc.abstractmethod
    def sequence_block(
        self, seq: Sequence, parent: int | None, token_ids: Seq[int], image_hashes: Seq[int]
    ) -> int:
        """A full block of ``seq`` after ``parent`` (None: its first), with its salts."""

    def block_hashes(self, seq: Sequence, block_size: int, num_full_blocks: int) -> list[int]:
        """Chained hashes of the sequence's first full blocks (cached on the sequence)."""
        hashes: list[int] = seq.block_hashes
        bs = block_size
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            tokens = seq.token_ids[i * bs : (i + 1) * bs]
            images = [image.content_hash for image in seq.images_in(i * bs, (i + 1) * bs)]
            parent = hashes[-1] if hashes else None
            hashes.append(self.sequence_block(seq, parent, tokens, images))
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

    def sequence_block(
        self, seq: Sequence, parent: int | None, token_ids: Seq[int], image_hashes: Seq[int]
    ) -> int:
        if parent is None:  # LongRoPE's, an adapter's or a cache_salt's salt stands as parent
            parent = seq.hash_salt
        return self.hash_block(parent, token_ids, image_hashes)


class Sha256CborBlockHasher(BlockHasher):
    """vLLM's ``sha256_cbor``, for routers that recompute a prompt's block hashes to
    find the replica that holds it (llm-d's precise prefix-cache scorer, Dynamo's KV
    router): a block's hash is the SHA-256 of the canonical CBOR of (its parent's hash,
    its token ids, its extra keys or None), a first block's parent the hash of
    PYTHONHASHSEED's value (random where it is unset, as vLLM's: then no one else can
    compute them). Kept whole as ints (256 bits).

    The extra keys are vLLM's, in its order: a LoRA adapter's name on every block, the
    content hashes of the images a block holds, and on a first block its cache_salt;
    then ours, which routers do not send: on a first block, LongRoPE's long factors.
    An adapter replaced under its name (load_inplace) is keyed by its name and
    fingerprint, so that no block of the one before serves it (vLLM would serve them).

    Unkeyed by design, so that routers can compute them: anyone can, and may craft a
    colliding block (the token comparison on a hit still keeps it from serving wrong
    KV), which is why ours stays the default."""

    def __init__(self, seed: str | None = None) -> None:
        self.none_hash = os.urandom(32) if seed is None else sha256_cbor(seed)
        self.adapters: dict[str, int] = {}  # name -> the first fingerprint it had

    def hash_block(
        self, parent: int | None, token_ids: Seq[int], image_hashes: Seq[Any] = ()
    ) -> int:
        parent_hash = self.none_hash if parent is None else parent.to_bytes(32, "big")
        extra_keys = tuple(image_hashes) or None
        return int.from_bytes(sha256_cbor((parent_hash, tuple(token_ids), extra_keys)), "big")

    def sequence_block(
        self, seq: Sequence, parent: int | None, token_ids: Seq[int], image_hashes: Seq[int]
    ) -> int:
        extra_keys: list[Any] = []
        if seq.lora_name is not None:
            first = self.adapters.setdefault(seq.lora_name, seq.lora_fingerprint or 0)
            replaced = first != (seq.lora_fingerprint or 0)
            extra_keys.append([seq.lora_name, seq.lora_fingerprint] if replaced else seq.lora_name)
        extra_keys.extend(image_hashes)
        if parent is None:
            if seq.sampling_params.cache_salt:
                extra_keys.append(seq.sampling_params.cache_salt)
            if seq.long_rope:
                extra_keys.append(["long_rope"])
        return self.hash_block(parent, token_ids, extra_keys)


def sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def block_hasher(algo: str, key: bytes | None = None, seed: str | None = None) -> BlockHasher:
    """The hasher EngineConfig.prefix_caching_hash_algo names: the keyed one with ``key``
    (a disk tier's directory keeps one for its replicas), or sha256_cbor from ``seed``
    (PYTHONHASHSEED's value, which the entry point reads)."""
    if algo == "sha256_cbor":
        return Sha256CborBlockHasher(seed)
    return KeyedBlockHasher(key)
