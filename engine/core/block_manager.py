"""Paged KV allocator: fixed-size blocks, reference counts, prefix caching, swap.

A sequence's ``block_table`` lists the physical blocks that hold its KV, in logical
order. A block is "used" while some sequence references it and "free" otherwise.
Free blocks that still hold a full, hashed block of KV stay findable by their hash
(automatic prefix caching) until the allocator hands them out again, least
recently freed first. Pure Python: the model runner does the actual copies that
``allocate_slots`` (copy-on-write), ``swap_out`` and ``swap_in`` return.

Block hashes are keyed with a random key drawn per block manager, so per process and
replica. Python's hash of a tuple of ints is the same in every process: unkeyed, anyone
could work out offline which hash a prompt's blocks get, and craft blocks that collide
with another tenant's (the token comparison on a hit keeps a collision from serving
wrong KV, but a colliding block registered first keeps the victim's out of the cache).
"""

from __future__ import annotations

import hashlib
import secrets
from array import array
from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

from hetero_infer.engine.core.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    # Hash of this block's tokens chained with every block before it; None until
    # the block is full and its KV has been computed.
    block_hash: int | None = None
    token_ids: tuple[int, ...] = ()


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int = 0,
        enable_prefix_caching: bool = True,
    ) -> None:
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # The block hashes' key: random per block manager (so per process and replica).
        self._hash_key = secrets.token_bytes(16)
        # Insertion order is eviction order: the first free block is handed out next.
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached_blocks: dict[int, int] = {}  # block_hash -> block_id
        self.free_cpu_blocks: list[int] = list(range(num_cpu_blocks - 1, -1, -1))
        self.prefix_queries = 0  # tokens looked up in the prefix cache at admission
        self.prefix_hits = 0  # of those, tokens found
        self.swapped_out_blocks = 0  # blocks ever copied to CPU

    # ---- accounting ----

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def memory_stats(self) -> dict[str, Any]:
        return {
            "total_blocks": self.num_blocks,
            "used_blocks": self.num_used_blocks,
            "free_blocks": self.num_free_blocks,
            "usage": self.usage,
            "cached_blocks": len(self.cached_blocks),
            "cpu_total_blocks": self.num_cpu_blocks,
            "cpu_used_blocks": self.num_cpu_blocks - len(self.free_cpu_blocks),
            "swapped_out_blocks": self.swapped_out_blocks,
            "prefix_cache_queries": self.prefix_queries,
            "prefix_cache_hits": self.prefix_hits,
            "prefix_cache_hit_rate": self.prefix_hits / self.prefix_queries
            if self.prefix_queries
            else 0.0,
        }

    # ---- prefix caching ----

    def hash_block(self, parent: int | None, token_ids: Seq[int]) -> int:
        """The keyed hash of one full block of tokens chained to its parent block's hash
        (None for a sequence's first block): a 64-bit keyed BLAKE2b, about 1 us a block."""
        data = array("q", token_ids).tobytes()
        if parent is not None:  # 8 more bytes: a first block never reads as a later one
            data += parent.to_bytes(8, "little")
        digest = hashlib.blake2b(data, digest_size=8, key=self._hash_key).digest()
        return int.from_bytes(digest, "little")

    def block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        """Chained hashes of the sequence's first full blocks (cached on the sequence)."""
        hashes: list[int] = seq.block_hashes
        bs = self.block_size
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(self.hash_block(parent, seq.token_ids[i * bs : (i + 1) * bs]))
        return hashes[:num_full_blocks]

    def allocate_cached_prefix(self, seq: Sequence) -> int:
        """Give a new sequence the cached blocks of its longest known prefix.

        Returns the number of tokens found; they count as computed. At least one
        token is always left to compute, since its logits are needed.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        seq.num_draft_computed_tokens = 0  # a preempted sequence's KV is gone
        if not self.enable_prefix_caching:
            return 0
        if seq.needs_every_prompt_position:
            return 0  # prompt logprobs or mean pooling: compute the whole prompt

        bs = self.block_size
        for i, block_hash in enumerate(self.block_hashes(seq, (seq.num_tokens - 1) // bs)):
            block_id = self.cached_blocks.get(block_hash)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != tuple(seq.token_ids[i * bs : (i + 1) * bs]):
                break  # a hash collision, not the same tokens
            self._take(block_id)
            seq.block_table.append(block_id)
        seq.num_computed_tokens = len(seq.block_table) * bs
        # A cached block holds a draft model's KV too (see register_full_blocks).
        seq.num_draft_computed_tokens = seq.num_computed_tokens
        return seq.num_computed_tokens

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries += num_tokens
        self.prefix_hits += num_hit_tokens

    def register_full_blocks(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Make the sequence's computed full blocks findable by later sequences: those of
        its first ``num_tokens`` tokens (default: every computed one). With a draft
        model, only the blocks whose draft KV is complete too, so that a sequence that
        finds a block in the cache finds both models' KV there."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        if num_tokens is None:
            num_tokens = seq.num_computed_tokens
        num_full = min(min(num_tokens, seq.num_computed_tokens) // bs, len(seq.block_table))
        hashes = self.block_hashes(seq, num_full)
        for i in range(seq.num_registered_blocks, num_full):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None:
                block.block_hash = hashes[i]
                block.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
                self.cached_blocks.setdefault(hashes[i], block.block_id)
        seq.num_registered_blocks = max(seq.num_registered_blocks, num_full)

    # ---- allocation ----

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks the sequence needs to hold its next ``num_new_tokens`` tokens."""
        total = seq.num_computed_tokens + num_new_tokens
        needed = max(0, -(-total // self.block_size) - len(seq.block_table))
        if self._needs_copy_on_write(seq):
            needed += 1
        return needed

    def can_allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Grow the block table for the next tokens; return (src, dst) block copies.

        A partly filled last block that other sequences share is copied before
        this sequence writes into it (copy-on-write).
        """
        assert self.can_allocate_slots(seq, num_new_tokens)
        copies = []
        if self._needs_copy_on_write(seq):
            shared = seq.block_table[-1]
            private = self._pop_free_block()
            self._release(shared)
            seq.block_table[-1] = private
            copies.append((shared, private))
        total = seq.num_computed_tokens + num_new_tokens
        while len(seq.block_table) * self.block_size < total:
            seq.block_table.append(self._pop_free_block())
        return copies

    def free_uncomputed_blocks(self, seq: Sequence) -> None:
        """Give back the blocks past the sequence's computed tokens: the slots a step took
        for draft tokens that were rejected. They were taken fresh for this sequence and
        never registered, so they go back as blocks that hold nothing."""
        keep = -(-seq.num_computed_tokens // self.block_size)
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop())

    def _needs_copy_on_write(self, seq: Sequence) -> bool:
        if not seq.block_table or seq.num_computed_tokens % self.block_size == 0:
            return False
        last = seq.num_computed_tokens // self.block_size
        return last < len(seq.block_table) and self.blocks[seq.block_table[last]].ref_count > 1

    def fork(self, parent: Sequence, child: Sequence, num_tokens: int | None = None) -> None:
        """Let ``child`` share the blocks of ``parent`` that hold its first ``num_tokens``
        computed tokens (all of them by default), e.g. n > 1 choices of one prompt."""
        assert not child.block_table
        if num_tokens is None:
            num_tokens = parent.num_computed_tokens
        assert num_tokens <= parent.num_computed_tokens
        shared = parent.block_table[: -(-num_tokens // self.block_size)]
        for block_id in shared:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(shared)
        child.num_computed_tokens = num_tokens
        child.num_draft_computed_tokens = min(parent.num_draft_computed_tokens, num_tokens)

    def free(self, seq: Sequence) -> None:
        """Release a sequence's GPU blocks. Its last blocks are evicted first."""
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def _pop_free_block(self) -> int:
        block_id, _ = self.free_blocks.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            if self.cached_blocks.get(block.block_hash) == block_id:
                del self.cached_blocks[block.block_hash]
            block.block_hash = None
            block.token_ids = ()
        block.ref_count = 1
        return block_id

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_blocks[block_id]
        block.ref_count += 1

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_blocks[block_id] = None
            if block.block_hash is None:
                # Holds nothing worth keeping: hand it out before cached blocks.
                self.free_blocks.move_to_end(block_id, last=False)

    # ---- swap ----

    def can_swap_out(self, seq: Sequence) -> bool:
        return len(seq.block_table) <= len(self.free_cpu_blocks)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move a sequence's KV to CPU blocks; return (gpu_block, cpu_block) copies."""
        assert self.can_swap_out(seq)
        mapping = [(gpu, self.free_cpu_blocks.pop()) for gpu in seq.block_table]
        self.swapped_out_blocks += len(mapping)
        self.free(seq)
        seq.block_table = [cpu for _, cpu in mapping]
        return mapping

    def can_swap_in(self, seq: Sequence, num_new_tokens: int) -> bool:
        total = seq.num_computed_tokens + num_new_tokens
        return -(-total // self.block_size) <= self.num_free_blocks

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring a swapped sequence's KV back; return (cpu_block, gpu_block) copies."""
        mapping = [(cpu, self._pop_free_block()) for cpu in seq.block_table]
        self.free_cpu_blocks.extend(cpu for cpu, _ in reversed(mapping))
        seq.block_table = [gpu for _, gpu in mapping]
        seq.num_registered_blocks = 0
        return mapping

    def free_swapped(self, seq: Sequence) -> None:
        """Release the CPU blocks of a swapped sequence (e.g. when it is aborted)."""
        self.free_cpu_blocks.extend(reversed(seq.block_table))
        seq.block_table = []
