"""The prefix cache's events, as vLLM publishes them for routers that send a request to
the replica already holding its prefix (llm-d's precise prefix-cache scorer, Dynamo's
KV router): blocks stored into the cache, blocks removed from it, the cache cleared.

The block manager records them as they happen, in a ``KVEventLog``; after each step the
engine core hands the step's events to the log's sink, which publishes them
(engine/entrypoints/kv_event_publisher.py). Without events nothing is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hetero_infer.engine.core.prefix_tiers import Registered

# vLLM's name for the KV cache on the device, which its CPU build uses too; routers
# read it as the fastest tier. The host RAM and disk tiers are not reported yet.
MEDIUM_DEVICE = "GPU"
# Routers key blocks by 64 bits: a hash wider than that (sha256_cbor's) is sent as its
# last 8 bytes, big-endian, as vLLM sends its own by default.
EXTERNAL_HASH_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class BlockStored:
    """Full blocks just computed into the cache, in order: ``parent_block_hash`` is the
    block before the first (None for a sequence's first block), ``token_ids`` all of
    theirs, ``block_size`` each's."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str
    group: int = 0  # the KV cache group (models/kv_layout.py)


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
        self, group: int, chain: list[int], registered: list[Registered], lora_id: int | None
    ) -> None:
        """Blocks of a sequence's hash ``chain`` just registered, (block, hash, tokens)
        each in chain order: one event for each run of consecutive blocks."""
        position = {block_hash: i for i, block_hash in enumerate(chain)}
        run: list[Registered] = []
        for entry in registered:
            if run and position[entry[1]] != position[run[-1][1]] + 1:
                self._stored_run(group, chain, position, run, lora_id)
                run = []
            run.append(entry)
        self._stored_run(group, chain, position, run, lora_id)

    def _stored_run(
        self,
        group: int,
        chain: list[int],
        position: dict[int, int],
        run: list[Registered],
        lora_id: int | None,
    ) -> None:
        first = position[run[0][1]]
        parent = chain[first - 1] if first > 0 else None
        self.events.append(
            BlockStored(
                [external_hash(block_hash) for _, block_hash, _ in run],
                None if parent is None else external_hash(parent),
                [token for _, _, tokens in run for token in tokens],
                self.block_size,
                lora_id,
                MEDIUM_DEVICE,
                group,
            )
        )

    def removed(self, group: int, block_hash: int) -> None:
        last = self.events[-1] if self.events else None
        if isinstance(last, BlockRemoved) and last.group == group:
            last.block_hashes.append(external_hash(block_hash))  # one event for a run
        else:
            self.events.append(BlockRemoved([external_hash(block_hash)], MEDIUM_DEVICE, group))

    def end_step(self) -> None:
        if self.events:
            events, self.events = self.events, []
            self.sink(events)
