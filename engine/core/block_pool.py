"""One pool of physical KV blocks: reference counts, the free list in eviction order,
the cached blocks findable by their hash, and the CPU blocks for swapped sequences.

A block is "used" while some sequence references it and "free" otherwise. Free blocks
that still hold a full, hashed block of KV stay findable by their hash (automatic
prefix caching) until the pool hands them out again, least recently freed first. The
block manager keeps one pool per KV cache group (core/block_manager.py); a pool knows
blocks, not sequences.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# The block a table holds where a sliding-window group no longer keeps the KV: never
# handed out, never written, never read (the kernels skip keys outside the window).
NULL_BLOCK = 0

# A block just computed into the prefix cache: (block id, block hash, its token ids).
Registered = tuple[int, int, tuple[int, ...]]


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    # Hash of this block's tokens chained with every block before it; None until
    # the block is full and its KV has been computed.
    block_hash: int | None = None
    token_ids: tuple[int, ...] = ()


class LazyBlocks(Sequence[Block]):
    """The pool's blocks, by id, each made when first asked for. The default cache's
    bytes hold very many blocks of a small model's KV (262k of a tiny test model's),
    most of them never handed out, and making them all took 0.3 s of its start."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.made: dict[int, Block] = {}

    def __len__(self) -> int:
        return self.num_blocks

    def __getitem__(self, block_id: int) -> Block:  # type: ignore[override]
        block = self.made.get(block_id)
        if block is None:
            if not 0 <= block_id < self.num_blocks:
                raise IndexError(f"block {block_id} of {self.num_blocks}")
            block = self.made[block_id] = Block(block_id)
        return block


class BlockPool:
    def __init__(
        self, num_blocks: int, num_cpu_blocks: int = 0, reserve_null: bool = False
    ) -> None:
        """``reserve_null``: keep block 0 (GPU and CPU) out of circulation as NULL_BLOCK."""
        first = 1 if reserve_null else 0
        assert num_blocks > first
        self.num_blocks = num_blocks
        self.num_reserved = first
        self.num_cpu_blocks = num_cpu_blocks
        self.blocks = LazyBlocks(num_blocks)
        # Insertion order is eviction order: the first free block is handed out next.
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(first, num_blocks))
        self.cached_blocks: dict[int, int] = {}  # block_hash -> block_id
        self.free_cpu_blocks: list[int] = list(range(num_cpu_blocks - 1, first - 1, -1))
        # Told (block id, hash, tokens) of a cached block about to be handed out again,
        # while its KV is still whole: the prefix cache's tiers save it (engine/kv/).
        self.on_evict: Callable[[int, int, tuple[int, ...]], None] | None = None
        # Told the hash of a block the cache no longer holds (its KV events).
        self.on_removed: Callable[[int], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_reserved - len(self.free_blocks)

    def find_cached(self, block_hash: int, token_ids: tuple[int, ...]) -> int | None:
        """The cached block of these tokens, or None (also on a hash collision)."""
        block_id = self.cached_blocks.get(block_hash)
        if block_id is None or self.blocks[block_id].token_ids != token_ids:
            return None
        return block_id

    def register(self, block_id: int, block_hash: int, token_ids: tuple[int, ...]) -> bool:
        """Make a full, computed block findable by its hash; whether it was not yet."""
        block = self.blocks[block_id]
        if block.block_hash is not None:
            return False
        block.block_hash = block_hash
        block.token_ids = token_ids
        self.cached_blocks.setdefault(block_hash, block_id)
        return True

    def forget_cached(self) -> None:
        """No block findable any more (a reset of the prefix cache): every block free,
        those handed out before first.

        Their memory is resident; a block never handed out costs a page fault when first
        written (on a VM whose host backs memory lazily, 2 MB pages faulted at 0.4 GB/s
        against 7 GB/s once backed), so a reset followed by new prompts reuses them."""
        assert self.num_used_blocks == 0, "blocks in use hold KV that must stay"
        for block in self.blocks.made.values():
            block.block_hash, block.token_ids = None, ()
            if block.block_id >= self.num_reserved:
                self.free_blocks.move_to_end(block.block_id, last=False)
        self.cached_blocks.clear()

    def pop_free(self) -> int:
        """Hand out the next free block (evicting what it cached), referenced once."""
        block_id, _ = self.free_blocks.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            if self.on_evict is not None:
                self.on_evict(block_id, block.block_hash, block.token_ids)
            if self.cached_blocks.get(block.block_hash) == block_id:
                del self.cached_blocks[block.block_hash]
                if self.on_removed is not None:
                    self.on_removed(block.block_hash)
            block.block_hash = None
            block.token_ids = ()
        block.ref_count = 1
        return block_id

    def take(self, block_id: int) -> None:
        """One more reference to a block (a free cached one leaves the free list)."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_blocks[block_id]
        block.ref_count += 1

    def release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_blocks[block_id] = None
            if block.block_hash is None:
                # Holds nothing worth keeping: hand it out before cached blocks.
                self.free_blocks.move_to_end(block_id, last=False)

    def is_shared(self, block_id: int) -> bool:
        return self.blocks[block_id].ref_count > 1
