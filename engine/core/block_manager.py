"""Paged KV allocator: fixed-size blocks, reference counts, prefix caching, swap.

A sequence's block tables list the physical blocks that hold its KV, in logical order,
one table per KV cache group (core/kv_cache_group.py), by index: the first keeps every
token's KV; a later one may keep a window's (a model's sliding-window layers'), its
blocks going back to its own pool as they leave the window. Pure Python: the model
runner does the actual copies that ``allocate_slots`` (copy-on-write), ``swap_out`` and
``swap_in`` return for the first group (the later groups' gather in
``later_group_moves`` until the scheduler takes them).

Prefix caching (core/block_pool.py) keeps freed full blocks findable by a hash of their
tokens chained to every block before them. A new sequence takes the longest cached
prefix whose blocks are all cached in each whole group and cached for the window before
its end in each windowed one: a chat's next turn finds the last turn's blocks in both.

Evicted blocks can be kept in host RAM and on disk (prefix_tiers.PrefixTiers). The
block hashes, keyed per block manager or by a disk tier's directory, are
block_hashing.py's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

from hetero_infer.engine.core.block_hashing import BlockHasher, KeyedBlockHasher
from hetero_infer.engine.core.block_pool import Block, BlockPool
from hetero_infer.engine.core.block_stats import block_stats
from hetero_infer.engine.core.kv_cache_group import BlockPair, KVCacheGroup
from hetero_infer.engine.core.kv_events import KVEventLog
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.core.step_data import BlockMoves, TierMoves

if TYPE_CHECKING:
    from hetero_infer.engine.core.prefix_tiers import PrefixTiers

__all__ = ["Block", "BlockManager"]


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int = 0,
        enable_prefix_caching: bool = True,
        later_groups: Seq[tuple[int | None, int]] = (),
        tiers: PrefixTiers | None = None,
        hasher: BlockHasher | None = None,
        events: KVEventLog | None = None,
    ) -> None:
        """``num_blocks``: the first group's; ``later_groups``: (window or None, blocks)
        of each later KV cache group (engine/models/kv_layout.py), a windowed one's
        blocks counting its null block. ``tiers``: see the module's doc; ``hasher``: the
        block hashes' (block_hashing.py); ``events``: where the cache's events go, if
        anywhere (kv_events.py)."""
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        pool = BlockPool(num_blocks, num_cpu_blocks)
        self.groups = [KVCacheGroup(0, pool, block_size, None)]
        for index, (window, group_blocks) in enumerate(later_groups, 1):
            windowed = window is not None  # a windowed group's null block: one more CPU block
            group_pool = BlockPool(group_blocks, num_cpu_blocks + windowed, reserve_null=windowed)
            self.groups.append(KVCacheGroup(index, group_pool, block_size, window))
        # The later groups' copies since the scheduler last took them.
        self.later_group_moves = [BlockMoves() for _ in self.groups[1:]]
        # The first group's pool, by the names callers read.
        self.num_blocks = num_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.blocks = pool.blocks
        self.free_blocks = pool.free_blocks
        self.cached_blocks = pool.cached_blocks
        self.free_cpu_blocks = pool.free_cpu_blocks
        # The block hashes: by default keyed at random per block manager (so per process
        # and replica).
        self.hasher = hasher or KeyedBlockHasher()
        self.events = events
        if events is not None:
            for group in self.groups:
                group.pool.on_removed = functools.partial(events.removed, group.index)
        self.tiers = tiers
        if tiers is not None:
            tiers.attach([group.pool for group in self.groups])
            if events is not None:
                tiers.announce_to(events)
        self.prefix_queries = 0  # tokens looked up in the prefix cache at admission
        self.prefix_hits = 0  # of those, tokens found
        self.swapped_out_blocks = 0  # blocks ever copied to CPU

    # ---- accounting (of the first group, which holds every computed token) ----

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def memory_stats(self) -> dict[str, Any]:
        counts = (self.swapped_out_blocks, self.prefix_queries, self.prefix_hits)
        return block_stats(self.groups, *counts)

    # ---- prefix caching ----

    def block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        """Chained hashes of the sequence's first full blocks (block_hashing.py)."""
        return self.hasher.block_hashes(seq, self.block_size, num_full_blocks)

    def allocate_cached_prefix(self, seq: Sequence) -> int:
        """Give a new sequence the cached blocks of its longest usable prefix.

        Returns the number of tokens found; they count as computed. At least one
        token is always left to compute, since its logits are needed.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        seq.num_draft_computed_tokens = 0  # a preempted sequence's KV is gone
        if not self.enable_prefix_caching:
            return 0
        if seq.needs_every_prompt_position:
            return 0  # prompt logprobs or mean pooling: compute the whole prompt

        hashes = self.block_hashes(seq, (seq.num_tokens - 1) // self.block_size)
        num_hit = len(hashes)
        found: list[list[Any]] = []
        for group in self.groups:  # the pool's misses filled from the tiers' host RAM
            found.append(group.find_cached(hashes[:num_hit], seq.token_ids, self.tiers))
            num_hit = group.usable_prefix(found[-1])
        if self.tiers is not None:  # a block from host RAM takes a free one of the pool
            num_hit = self.tiers.affordable(self.groups, found, num_hit)
        for group, group_found in zip(self.groups, found, strict=True):
            loaded = group.take_cached(seq, group_found, num_hit, self.tiers)
            if self.events is not None and loaded:  # back in the pool from a tier
                self.events.stored(group.index, hashes, loaded, seq)
        seq.num_computed_tokens = num_hit * self.block_size
        # A cached block holds a draft model's KV too (see register_full_blocks).
        seq.num_draft_computed_tokens = seq.num_computed_tokens
        return seq.num_computed_tokens

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, in the pools and in host RAM (the disk tier's files
        stay: other replicas share them), as vLLM's reset does; only while no sequence
        holds a block, else False and nothing changes."""
        if any(group.pool.num_used_blocks for group in self.groups):
            return False
        for group in self.groups:
            group.pool.forget_cached()
        if self.tiers is not None:
            self.tiers.forget_host_blocks()
        if self.events is not None:
            self.events.cleared()
        return True

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries += num_tokens
        self.prefix_hits += num_hit_tokens
        if self.tiers is not None:
            self.tiers.record_lookup(num_tokens, num_hit_tokens)

    def waits_for_tier_reads(self, seq: Sequence) -> bool:
        """Whether a waiting sequence waits for its prefix's disk reads (PrefixTiers)."""
        return self.tiers is not None and self.tiers.needs_reads(self, seq)

    def take_tier_moves(self) -> list[TierMoves]:
        return [] if self.tiers is None else self.tiers.take_moves()

    def tier_reads_done(self, results: tuple[tuple[int, int, bool], ...]) -> None:
        if self.tiers is not None:
            self.tiers.reads_done(results)

    def register_full_blocks(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Make the sequence's computed full blocks findable by later sequences: those of
        its first ``num_tokens`` tokens (default: every computed one). With a draft
        model, only the blocks whose draft KV is complete too, so that a sequence that
        finds a block in the cache finds both models' KV there."""
        if not self.enable_prefix_caching:
            return
        if num_tokens is None:
            num_tokens = seq.num_computed_tokens
        num_tokens = min(num_tokens, seq.num_computed_tokens)
        num_full = min(num_tokens // self.block_size, len(seq.block_table))
        if num_full <= seq.num_registered_blocks:  # most decode steps fill no block
            return
        hashes = self.block_hashes(seq, num_full)
        for group in self.groups:
            registered = group.register(seq, hashes, seq.num_registered_blocks, seq.token_ids)
            if self.tiers is not None and registered:
                self.tiers.persist(group.index, registered)
            if self.events is not None and registered:
                self.events.stored(group.index, hashes, registered, seq)
        seq.num_registered_blocks = max(seq.num_registered_blocks, num_full)

    # ---- allocation ----

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New first-group blocks the sequence needs to hold its next ``num_new_tokens`` tokens."""
        return self.groups[0].num_blocks_needed(seq, num_new_tokens)

    def has_room(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether its tables hold the next tokens as they are (most decode steps)."""
        for group in self.groups:  # noqa: SIM110 (all() costs 3x here, as below)
            if not group.has_room(seq, num_new_tokens):
                return False
        return True

    def can_allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        for group in self.groups:  # a loop, not all(): a decode step asks it per sequence
            if group.num_blocks_needed(seq, num_new_tokens) > group.pool.num_free_blocks:
                return False
        return True

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> list[BlockPair]:
        """Grow the block tables for the next tokens; return the first group's (src,
        dst) block copies (copy-on-write of a shared, partly filled last block). The
        caller has checked can_allocate_slots (checking again would double a decode
        step's cost here; a pool short of blocks fails in pop_free anyway)."""
        for group, moves in self._later_groups():
            moves.copy += group.allocate_slots(seq, num_new_tokens)
        return self.groups[0].allocate_slots(seq, num_new_tokens)

    def free_uncomputed_blocks(self, seq: Sequence) -> None:
        """Give back the blocks past the sequence's computed tokens: the slots a step took
        for draft tokens that were rejected. They were taken fresh for this sequence and
        never registered, so they go back as blocks that hold nothing."""
        for group in self.groups:
            group.free_uncomputed(seq)

    def fork(self, parent: Sequence, child: Sequence, num_tokens: int | None = None) -> None:
        """Let ``child`` share the blocks of ``parent`` that hold its first ``num_tokens``
        computed tokens (all of them by default), e.g. n > 1 choices of one prompt."""
        assert not child.block_table
        if num_tokens is None:
            num_tokens = parent.num_computed_tokens
        assert num_tokens <= parent.num_computed_tokens
        for group in self.groups:
            group.fork(parent, child, num_tokens)
        child.num_computed_tokens = num_tokens
        child.num_draft_computed_tokens = min(parent.num_draft_computed_tokens, num_tokens)

    def free(self, seq: Sequence) -> None:
        """Release a sequence's GPU blocks. Its last blocks are evicted first."""
        for group in self.groups:
            group.free(seq)
        seq.num_registered_blocks = 0

    def forget_copies_into(self, seq: Sequence, copies: list[BlockPair]) -> None:
        """Drop this step's copy-on-write copies into the sequence's own blocks (before
        it is preempted: they are freed, and may be handed out again in the step)."""
        later_copies = [moves.copy for moves in self.later_group_moves]
        for group, group_copies in zip(self.groups, [copies, *later_copies], strict=True):
            own = set(group.table(seq))
            group_copies[:] = [c for c in group_copies if c[1] not in own]

    def take_later_group_moves(self) -> list[BlockMoves]:
        moves = self.later_group_moves
        self.later_group_moves = [BlockMoves() for _ in moves]
        return moves

    def _later_groups(self) -> zip[tuple[KVCacheGroup, BlockMoves]]:
        """Each group after the first, with its copies since the scheduler took them."""
        return zip(self.groups[1:], self.later_group_moves, strict=True)

    # ---- swap ----

    def can_swap_out(self, seq: Sequence) -> bool:
        return all(group.can_swap_out(seq) for group in self.groups)

    def swap_out(self, seq: Sequence) -> list[BlockPair]:
        """Move a sequence's KV to CPU blocks; return the first group's (gpu_block,
        cpu_block) copies."""
        assert self.can_swap_out(seq)
        for group, moves in self._later_groups():
            moves.swap_out += group.swap_out(seq)
        mapping = self.groups[0].swap_out(seq)
        self.swapped_out_blocks += len(mapping)
        seq.num_registered_blocks = 0
        return mapping

    def can_swap_in(self, seq: Sequence, num_new_tokens: int) -> bool:
        return all(
            group.blocks_to_swap_in(seq, num_new_tokens) <= group.pool.num_free_blocks
            for group in self.groups
        )

    def swap_in(self, seq: Sequence) -> list[BlockPair]:
        """Bring a swapped sequence's KV back; return the first group's (cpu_block,
        gpu_block) copies."""
        for group, moves in self._later_groups():
            moves.swap_in += group.swap_in(seq)
        seq.num_registered_blocks = 0
        return self.groups[0].swap_in(seq)

    def free_swapped(self, seq: Sequence) -> None:
        """Release the CPU blocks of a swapped sequence (e.g. when it is aborted)."""
        for group in self.groups:
            group.free_swapped(seq)
