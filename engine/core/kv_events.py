"""The prefix cache's events, as vLLM publishes them for routers that send a request to
the replica already holding its prefix (llm-d's precise prefix-cache scorer, Dynamo's
KV router): blocks stored into the cache, blocks removed from it, the cache cleared.

The block manager records the device cache's as they happen, in a ``KVEventLog``, and
the prefix cache's tiers record their own (host RAM, disk); after each step the engine
core hands the step's events to the log's sink, which publishes them
(engine/entrypoints/kv_event_publisher.py). Without events nothing is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hetero_infer.engine.core.block_pool import Registered

if TYPE_CHECKING:
    from hetero_infer.engine.core.sequence import Sequence

# Where a block is, by vLLM's names: "GPU" for the KV cache on the device, which its CPU
# build uses too (routers read it as the fastest tier); "CPU" for host RAM, as its CPU
# offloading says; "DISK" for the disk tier's files.
MEDIUM_DEVICE = "GPU"
MEDIUM_HOST = "CPU"
MEDIUM_DISK = "DISK"
# Routers key blocks by 64 bits: a hash wider than that (sha256_cbor's) is sent as its
# last 8 bytes, big-endian, as vLLM sends its own by default.
EXTERNAL_HASH_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class BlockStored:
    """Full blocks just stored in a tier, in order: ``parent_block_hash`` is the block
    before the first (None for a sequence's first block, and for blocks a host tier
    saved, which it keeps without their chain), ``token_ids`` all of theirs,
    ``block_size`` each's. ``lora_id`` and ``lora_name`` are the LoRA adapter's."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str
    group: int = 0  # the KV cache group (models/kv_layout.py)
    lora_name: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str
    group: int = 0


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def external_hash(block_hash: int) -> int:
    return block_hash & EXTERNAL_HASH_MASK


class KVEventLog:
    """One step's events, handed to ``sink`` at the step's end (``end_step``). It starts
    with AllBlocksCleared: a new engine's cache is empty, whatever a router knew of the
    replica before."""

    def __init__(self, sink: Callable[[list[KVEvent]], None], block_size: int) -> None:
        self.sink = sink
        self.block_size = block_size
        self.events: list[KVEvent] = [AllBlocksCleared()]

    def stored(
        self, group: int, chain: list[int], registered: list[Registered], seq: Sequence
    ) -> None:
        """Blocks of a sequence's hash ``chain`` just registered in the device cache,
        (block, hash, tokens) each in chain order: one event for each run of
        consecutive blocks."""
        position = {block_hash: i for i, block_hash in enumerate(chain)}
        run: list[Registered] = []
        for entry in registered:
            if run and position[entry[1]] != position[run[-1][1]] + 1:
                self._stored_run(group, chain, position, run, seq)
                run = []
            run.append(entry)
        self._stored_run(group, chain, position, run, seq)

    def _stored_run(
        self,
        group: int,
        chain: list[int],
        position: dict[int, int],
        run: list[Registered],
        seq: Sequence,
    ) -> None:
        first = position[run[0][1]]
        parent = chain[first - 1] if first > 0 else None
        self.events.append(
            BlockStored(
                [external_hash(block_hash) for _, block_hash, _ in run],
                None if parent is None else external_hash(parent),
                [token for _, _, tokens in run for token in tokens],
                self.block_size,
                seq.lora_slot or None,
                MEDIUM_DEVICE,
                group,
                seq.lora_name,
            )
        )

    def tier_stored(
        self, group: int, medium: str, block_hash: int, token_ids: tuple[int, ...]
    ) -> None:
        """A block a slower tier (host RAM, disk) now holds: kept by its hash alone."""
        hashes, tokens = [external_hash(block_hash)], list(token_ids)
        self.events.append(BlockStored(hashes, None, tokens, self.block_size, None, medium, group))

    def removed(self, group: int, block_hash: int, medium: str = MEDIUM_DEVICE) -> None:
        """A block the tier ``medium`` no longer holds."""
        last = self.events[-1] if self.events else None
        if isinstance(last, BlockRemoved) and (last.group, last.medium) == (group, medium):
            last.block_hashes.append(external_hash(block_hash))  # one event for a run
        else:
            self.events.append(BlockRemoved([external_hash(block_hash)], medium, group))

    def cleared(self) -> None:
        """Every tier this replica reports emptied (a reset of its prefix cache)."""
        self.events.append(AllBlocksCleared())

    def end_step(self) -> None:
        if self.events:
            events, self.events = self.events, []
            self.sink(events)
