"""The scheduler's side of the prefix cache's tiers: which blocks are saved, and which
come back from host RAM or disk instead of being recomputed.

With a disk tier, each block computed into the prefix cache is written to its file
as soon as it is whole (``persist``), so that a restart finds it, evicted or not; a
stop writes what is still missing (``unsaved_moves``). A cached block that its pool
hands out again (BlockPool.pop_free) is saved first: to a host slot (the least
recently used one goes), and through to its file unless the file exists already. The
step's moves are plain lists the runner applies before anything writes into the
blocks they read (TierMoves says the order); the files are written off the step.

A prefix lookup (BlockManager.allocate_cached_prefix) takes blocks that left the pool
from their host slots: each gets a fresh block, registered at once, which the runner
fills before the forward pass. Blocks only on disk are read into host slots a step
ahead (``needs_reads``; the sequence waits that step): the runner checks each file
whole, and reports back which were good, so a bad file is a miss, never KV. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hetero_infer.engine.core.block_pool import BlockPool
from hetero_infer.engine.core.kv_events import KVEventLog
from hetero_infer.engine.core.step_data import TierMoves
from hetero_infer.engine.kv.disk_changes import DiskChanges
from hetero_infer.engine.kv.disk_layout import DiskLayout
from hetero_infer.engine.kv.tier_counters import TierCounters
from hetero_infer.engine.kv.tier_events import TierEvents
from hetero_infer.engine.kv.tier_index import SlotIndex

if TYPE_CHECKING:
    from hetero_infer.engine.core.prefix_tiers import BlockManagerView, GroupView
    from hetero_infer.engine.core.sequence import Sequence

_DEVICE, _RAM, _READING, _DISK = "device", "ram", "reading", "disk"


@dataclass(frozen=True)
class TierHit:
    """A block a lookup found in a host slot rather than in the pool."""

    slot: int
    block_hash: int
    token_ids: tuple[int, ...]


class TierPlanner:
    """The tiers' PrefixTiers (engine/core/prefix_tiers.py): host slots, then disk."""

    def __init__(
        self,
        num_groups: int,
        num_slots: int,
        block_size: int,
        disk: DiskLayout | None,
        disk_changes: DiskChanges | None = None,
    ) -> None:
        self.block_size = block_size
        self.indexes = [SlotIndex(num_slots) for _ in range(num_groups)]
        self.disk = disk
        self.moves = [TierMoves(g) for g in range(num_groups)]
        self.bad: set[tuple[int, int]] = set()  # (group, hash) of files refused
        self.counters = TierCounters()
        self._lookup = TierCounters()  # the lookup in progress, counted once admitted
        self._device_blocks = 0  # its leading blocks found in the pool
        # Sequences that waited a step for their reads: the next time they are admitted
        # with what host RAM holds then. Reads may evict the same prefix's other blocks
        # from a small RAM, and waiting again for those could go on forever.
        self._waited: set[str] = set()
        self.disk_changes = disk_changes  # the files written and removed, for the events
        self.events: TierEvents | None = None  # once KV events are on

    def attach(self, pools: list[BlockPool]) -> None:
        for group, pool in enumerate(pools):
            pool.on_evict = lambda block, h, tokens, g=group: self.save(g, block, h, tokens)

    def announce_to(self, events: KVEventLog) -> None:
        self.events = TierEvents(events, self.indexes, self.disk_changes)

    def _indexed(self, group: int, block_hash: int, slot: int, tokens: tuple[int, ...]) -> None:
        """A block now in a host slot, findable by later lookups."""
        self.indexes[group].put(block_hash, slot, tokens)
        if self.events is not None:
            self.events.host_stored(group, block_hash, tokens)

    # ---- saving ----

    def save(self, group: int, block_id: int, block_hash: int, token_ids: tuple[int, ...]) -> None:
        """An evicted block's KV, to a host slot (and through to disk)."""
        index = self.indexes[group]
        if index.find(block_hash, token_ids) is not None:
            return  # its bytes are there already (it came back from that slot)
        slot = index.allocate()
        if slot is None:
            self.counters.saves_dropped += 1
            return
        self._indexed(group, block_hash, slot, token_ids)
        moves = self.moves[group]
        moves.save.append((block_id, slot))
        if self.disk is not None and not self.disk.exists(group, block_hash):
            moves.write.append((slot, block_hash, token_ids))

    def persist(self, group: int, registered: list[tuple[int, int, tuple[int, ...]]]) -> None:
        """Blocks just computed into the prefix cache (block, hash, tokens), to disk
        unless their files exist: a restart finds them, evicted or not."""
        if self.disk is None:
            return
        moves = self.moves[group]
        for block_id, block_hash, token_ids in registered:
            if not self.disk.exists(group, block_hash):
                moves.persist.append((block_id, block_hash, token_ids))

    def forget_host_blocks(self) -> None:
        for index in self.indexes:
            index.forget()

    def unsaved_moves(self, pools: list[BlockPool]) -> list[TierMoves]:
        """At a stop: the moves that write every block the pools and host RAM hold and
        disk does not (a block whose write was dropped, or not yet made)."""
        if self.disk is None:
            return []
        moves = [TierMoves(g) for g in range(len(self.indexes))]
        for group, (pool, index) in enumerate(zip(pools, self.indexes, strict=True)):
            for block_hash, block_id in pool.cached_blocks.items():
                if not self.disk.exists(group, block_hash):
                    token_ids = pool.blocks[block_id].token_ids
                    moves[group].persist.append((block_id, block_hash, token_ids))
            for block_hash, (slot, token_ids) in index.entries.items():
                if not self.disk.exists(group, block_hash):
                    moves[group].write.append((slot, block_hash, token_ids))
        return [m for m in moves if m]

    # ---- lookups ----

    def find(
        self, group: int, found: list[Any], hashes: list[int], token_ids: list[int], window: bool
    ) -> list[Any]:
        """``found`` (the pool's hit or None, per hash) with host slots filling its
        misses; without a window, up to the first block neither holds."""
        index, bs = self.indexes[group], self.block_size
        if group == 0:
            run = [isinstance(b, int) for b in found] + [False]
            self._device_blocks = run.index(False)
        out: list[Any] = []
        for i, (entry, block_hash) in enumerate(zip(found, hashes, strict=True)):
            if entry is None:
                tokens = tuple(token_ids[i * bs : (i + 1) * bs])
                slot = index.find(block_hash, tokens)
                if slot is None:
                    self._lookup.ram_misses += 1
                else:
                    index.use(slot)  # no save this step may take it before it is loaded
                    entry = TierHit(slot, block_hash, tokens)
            out.append(entry)
            if entry is None and not window:
                break
        return out

    def affordable(self, groups: Seq[GroupView], found: list[list[Any]], num_hit: int) -> int:
        """The longest prefix, up to ``num_hit`` blocks, that every group's pool can
        give now (KVCacheGroup.can_take: a busy pool has few free blocks)."""
        while num_hit > 0 and not all(
            group.can_take(entries, num_hit) for group, entries in zip(groups, found, strict=True)
        ):
            num_hit -= 1
        return num_hit

    def load(self, group: int, pool: BlockPool, hit: TierHit) -> int:
        """A fresh block for a host slot's KV, findable at once: the runner fills it
        before the step's forward pass."""
        block_id = pool.pop_free()
        pool.register(block_id, hit.block_hash, hit.token_ids)
        self.moves[group].load.append((hit.slot, block_id))
        self._lookup.ram_hits += 1
        return block_id

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """An admitted sequence's lookup: its counts join the totals."""
        c, lookup = self.counters, self._lookup
        num_device_tokens = min(num_hit_tokens, self._device_blocks * self.block_size)
        c.ram_hits += lookup.ram_hits
        c.ram_misses += lookup.ram_misses
        c.disk_misses += lookup.disk_misses
        c.queried_tokens += num_tokens - num_device_tokens
        c.hit_tokens += num_hit_tokens - num_device_tokens
        self._lookup = TierCounters()

    # ---- disk reads, a step ahead ----

    def needs_reads(self, bm: BlockManagerView, seq: Sequence) -> bool:
        """Whether the sequence's prefix continues on disk past the pool and host RAM:
        then the files it needs are read into host slots this step (or are being read),
        and it waits a step rather than recompute them."""
        self._lookup = TierCounters()
        if self.disk is None or not bm.enable_prefix_caching or seq.needs_every_prompt_position:
            return False
        if seq.request_id in self._waited:
            self._waited.discard(seq.request_id)
            return False
        bs = self.block_size
        hashes = bm.block_hashes(seq, (seq.num_tokens - 1) // bs)
        views: list[list[str | None]] = []
        num_hit = len(hashes)
        for group in bm.groups:
            view = self._where(group, hashes[:num_hit], seq.token_ids)
            views.append(view + [None] * (num_hit - len(view)))
            num_hit = group.usable_prefix(views[-1])
        wanted: list[tuple[int, int]] = []  # (group, logical block) read from disk
        while num_hit > 0:
            wanted = [
                (group.index, i)
                for group, view in zip(bm.groups, views, strict=True)
                for i in range(group.first_kept(num_hit * bs), num_hit)
                if view[i] in (_DISK, _READING)
            ]
            if all(
                sum(1 for g, i in wanted if g == n and views[n][i] == _DISK)
                <= index.num_available // 2
                for n, index in enumerate(self.indexes)
            ):
                break
            num_hit -= 1  # more than host RAM holds at once: read a shorter prefix
        if num_hit == 0 or not wanted:
            return False
        for group, i in wanted:
            if views[group][i] == _DISK:
                self._plan_read(group, hashes[i], tuple(seq.token_ids[i * bs : (i + 1) * bs]))
        self._waited.add(seq.request_id)
        return True

    def _where(
        self, kv_group: GroupView, hashes: list[int], token_ids: list[int]
    ) -> list[str | None]:
        """Where each block is: the pool, a host slot, a read in flight, disk or none
        (without a window, up to the first block that is nowhere)."""
        group, pool, window = kv_group.index, kv_group.pool, kv_group.window
        index, bs = self.indexes[group], self.block_size
        assert self.disk is not None
        where: list[str | None] = []
        for i, block_hash in enumerate(hashes):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            entry = index.entries.get(block_hash)
            if pool.find_cached(block_hash, tokens) is not None:
                where.append(_DEVICE)
            elif entry is not None and entry[1] == tokens:
                where.append(_RAM)
            elif block_hash in index.pending:
                where.append(_READING)
            elif (group, block_hash) not in self.bad and self.disk.exists(group, block_hash):
                where.append(_DISK)
            else:
                where.append(None)
                self._lookup.disk_misses += 1
                if window is None:
                    break
        return where

    def _plan_read(self, group: int, block_hash: int, token_ids: tuple[int, ...]) -> None:
        index = self.indexes[group]
        slot = index.allocate()
        if slot is None:
            return
        index.pending[block_hash] = (slot, token_ids)
        self.moves[group].read.append((slot, block_hash, token_ids))

    def reads_done(self, results: tuple[tuple[int, int, bool], ...]) -> None:
        """The runner's word on this step's disk reads: good files' slots join the
        index; a bad file's slot goes back, and the file is not asked for again."""
        for group, block_hash, ok in results:
            index = self.indexes[group]
            slot, token_ids = index.pending.pop(block_hash)
            if ok:
                self._indexed(group, block_hash, slot, token_ids)
                self.counters.disk_hits += 1
            else:
                index.release(slot)
                self.bad.add((group, block_hash))
                self.counters.disk_misses += 1

    def take_moves(self) -> list[TierMoves]:
        """The step's moves, per group that has any; the slots they use are free to
        be taken again from the next step on."""
        moves = [m for m in self.moves if m]
        self.moves = [TierMoves(g) for g in range(len(self.moves))]
        if self.events is not None:
            self.events.disk_changed()
        for index in self.indexes:
            index.end_step()
        return moves

    def stats(self) -> dict[str, int]:
        return self.counters.stats(ram_blocks=sum(len(index.entries) for index in self.indexes))
