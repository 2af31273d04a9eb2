"""Which block hashes one KV cache group's host slots hold: the RAM tier's bookkeeping.

Least recently used first. A slot that this step's moves read or write is busy until
the scheduler hands the moves over (``end_step``): evicting it would let a second save
overwrite bytes a load or a disk write of the same step has yet to read. Pure Python.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class SlotIndex:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        # block hash -> (slot, the block's tokens), least recently used first
        self.entries: OrderedDict[int, tuple[int, tuple[int, ...]]] = OrderedDict()
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.busy: set[int] = set()
        # Disk reads in flight: block hash -> (slot, tokens), indexed once they land.
        self.pending: dict[int, tuple[int, tuple[int, ...]]] = {}
        # Told the hash of an entry whose slot is taken for another (its KV events).
        self.on_removed: Callable[[int], None] | None = None

    def find(self, block_hash: int, token_ids: tuple[int, ...]) -> int | None:
        """The slot that holds these tokens' block, or None (also on a hash collision)."""
        entry = self.entries.get(block_hash)
        if entry is None or entry[1] != token_ids:
            return None
        self.entries.move_to_end(block_hash)
        return entry[0]

    def use(self, slot: int) -> None:
        """Keep a slot as it is until the step's moves are handed over."""
        self.busy.add(slot)

    def allocate(self) -> int | None:
        """A slot to write into this step: a free one, else the least recently used
        entry's that no move of this step touches; None if every slot is busy."""
        if self.free_slots:
            slot = self.free_slots.pop()
        else:
            victim = next((h for h, (s, _) in self.entries.items() if s not in self.busy), None)
            if victim is None:
                return None
            slot = self.entries.pop(victim)[0]
            if self.on_removed is not None:
                self.on_removed(victim)
        self.busy.add(slot)
        return slot

    def put(self, block_hash: int, slot: int, token_ids: tuple[int, ...]) -> None:
        self.entries[block_hash] = (slot, token_ids)

    def forget(self) -> None:
        """Every entry gone, its slot free (reads in flight land as they come)."""
        self.free_slots.extend(slot for slot, _ in self.entries.values())
        self.entries.clear()

    def release(self, slot: int) -> None:
        self.free_slots.append(slot)

    @property
    def num_available(self) -> int:
        """Slots a burst of reads may take now: free or held by entries not busy."""
        held = sum(1 for s, _ in self.entries.values() if s not in self.busy)
        return len(self.free_slots) + held

    def end_step(self) -> None:
        self.busy.clear()
