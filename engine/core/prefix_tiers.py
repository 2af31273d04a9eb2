"""What the block manager asks of the prefix cache's tiers (host RAM, disk), as a
protocol: the scheduling core drives them without knowing how they keep blocks
(engine/kv/tier_planner.py implements it). A tier's hit is opaque here: a lookup puts
it among a group's found blocks, and ``load`` turns it into a block of the pool.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any, Protocol

from hetero_infer.engine.core.block_pool import BlockPool, Registered
from hetero_infer.engine.core.step_data import TierMoves

if TYPE_CHECKING:
    from hetero_infer.engine.core.kv_events import KVEventLog
    from hetero_infer.engine.core.sequence import Sequence


class GroupView(Protocol):
    """What the tiers read of a KV cache group: core/kv_cache_group.py's KVCacheGroup,
    which hands its lookups to the tiers and so imports this module (naming it here
    would close a circle)."""

    index: int
    pool: BlockPool
    window: int | None

    def first_kept(self, position: int) -> int: ...

    def usable_prefix(self, found: list[Any]) -> int: ...

    def can_take(self, found: list[Any], num_blocks: int) -> bool: ...


class BlockManagerView(Protocol):
    """What the tiers read of the block manager (core/block_manager.py's BlockManager,
    which drives them and so imports this module) to plan a waiting sequence's disk
    reads."""

    enable_prefix_caching: bool
    groups: Seq[GroupView]

    def block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]: ...


class PrefixTiers(Protocol):
    def attach(self, pools: list[BlockPool]) -> None:
        """Take each group's pool's evicted blocks from now on (BlockPool.on_evict)."""

    def announce_to(self, events: KVEventLog) -> None:
        """Record what host RAM and disk store and remove from now on (KV events)."""

    def persist(self, group: int, registered: list[Registered]) -> None:
        """Blocks just computed into the group's prefix cache, to keep past a restart."""

    def forget_host_blocks(self) -> None:
        """Drop every block host RAM holds (a reset of the prefix cache)."""

    def unsaved_moves(self, pools: list[BlockPool]) -> list[TierMoves]:
        """At a stop: the moves that keep every block not kept yet."""

    def find(
        self, group: int, found: list[Any], hashes: list[int], token_ids: list[int], window: bool
    ) -> list[Any]:
        """``found`` (the pool's hits, None for a miss) with the tiers' hits filling
        misses; without a window, up to the first block neither holds."""

    def affordable(self, groups: Seq[GroupView], found: list[list[Any]], num_hit: int) -> int:
        """The longest prefix, up to ``num_hit`` blocks, every group's pool can give now."""

    def load(self, group: int, pool: BlockPool, hit: Any) -> int:
        """A fresh block of the pool for a tier's hit, filled before the next forward pass."""

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """An admitted sequence's lookup, for the counts."""

    def needs_reads(self, bm: BlockManagerView, seq: Sequence) -> bool:
        """Whether a waiting sequence waits a step for its prefix's slower tier."""

    def reads_done(self, results: tuple[tuple[int, int, bool], ...]) -> None:
        """The runner's word on the step's reads: (group, hash, good) each."""

    def take_moves(self) -> list[TierMoves]:
        """The step's moves, per group that has any."""

    def stats(self) -> dict[str, int]:
        """Counts for LLMEngine.memory_stats."""
