"""One KV cache group: the layers that share block tables, their pool, and each
sequence's table in it.

Which layers share a group, and what it keeps, is the model's KV layout
(engine/models/kv_layout.py): a group keeps every token's KV, or only what a window
still sees. Every table of a sequence indexes the same logical blocks (block i holds
tokens i * block_size onwards); in a windowed group a block that has left the window
goes back to its pool and its entry becomes NULL_BLOCK, so that group's memory per
sequence is bounded by the window. The block manager drives the groups together
(core/block_manager.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hetero_infer.engine.core.block_pool import NULL_BLOCK, BlockPool, Registered
from hetero_infer.engine.core.sequence import Sequence

if TYPE_CHECKING:
    from hetero_infer.engine.core.prefix_tiers import PrefixTiers

BlockPair = tuple[int, int]


class KVCacheGroup:
    def __init__(self, index: int, pool: BlockPool, block_size: int, window: int | None) -> None:
        """``index``: the group's table in ``Sequence.block_tables``; ``window``: the
        keys a query sees (None: all of them)."""
        assert window is None or pool.num_reserved == 1, "a windowed group needs a null block"
        self.index = index
        self.pool = pool
        self.block_size = block_size
        self.window = window
        # What a table holds for a block left of the window (None: no such entry).
        self.null = NULL_BLOCK if window is not None else None

    def table(self, seq: Sequence) -> list[int]:
        tables = seq.block_tables
        while len(tables) <= self.index:  # the sequence's first blocks in this group
            tables.append([])
        return tables[self.index]

    def set_table(self, seq: Sequence, table: list[int]) -> None:
        self.table(seq)
        seq.block_tables[self.index] = table

    def first_kept(self, position: int) -> int:
        """The first logical block a query at ``position`` (or later) still sees."""
        if self.window is None:
            return 0
        return max(0, position - self.window + 1) // self.block_size

    # ---- growing and shrinking a table ----

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Free blocks the sequence takes for its next ``num_new_tokens`` tokens, net of
        those it gives back as they leave the window."""
        table = self.table(seq)
        total = seq.num_computed_tokens + num_new_tokens
        needed = max(0, -(-total // self.block_size) - len(table))
        if self._needs_copy_on_write(seq, table):
            needed += 1
        if self.window is None:
            return needed
        returned = sum(1 for i in self._out_of_window(seq) if not self.pool.is_shared(table[i]))
        return max(0, needed - returned)

    def has_room(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether the table holds the next ``num_new_tokens`` tokens as it is: no block
        to take, to copy on write or (outside a window) to give back."""
        if self.window is not None:
            return False
        table = self.table(seq)
        if seq.num_computed_tokens + num_new_tokens > len(table) * self.block_size:
            return False
        return not self._needs_copy_on_write(seq, table)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> list[BlockPair]:
        """Grow the table for the next tokens; return (src, dst) block copies. The
        blocks that left the window go back first; a partly filled last block that
        other sequences share is copied before this sequence writes into it."""
        table = self.table(seq)
        for i in self._out_of_window(seq):
            self.pool.release(table[i])
            table[i] = NULL_BLOCK
        copies = []
        if self._needs_copy_on_write(seq, table):
            last = seq.num_computed_tokens // self.block_size
            shared = table[last]
            private = self.pool.pop_free()
            self.pool.release(shared)
            table[last] = private
            copies.append((shared, private))
        total = seq.num_computed_tokens + num_new_tokens
        while len(table) * self.block_size < total:
            table.append(self.pool.pop_free())
        return copies

    def free_uncomputed(self, seq: Sequence) -> None:
        """Give back the blocks past the sequence's computed tokens (rejected drafts')."""
        table = self.table(seq)
        keep = -(-seq.num_computed_tokens // self.block_size)
        while len(table) > keep:
            self.pool.release(table.pop())

    def fork(self, parent: Sequence, child: Sequence, num_tokens: int) -> None:
        """Let ``child`` share the blocks of ``parent`` that hold its first ``num_tokens``."""
        # The window kept before the prompt's end is the parent's (_out_of_window).
        assert self.window is None or child.num_prompt_tokens == parent.num_prompt_tokens
        shared = self.table(parent)[: -(-num_tokens // self.block_size)]
        for block_id in shared:
            if block_id != self.null:
                self.pool.take(block_id)
        self.set_table(child, list(shared))

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks, its last ones to be evicted first."""
        for block_id in reversed(self.table(seq)):
            if block_id != self.null:
                self.pool.release(block_id)
        self.set_table(seq, [])

    def _out_of_window(self, seq: Sequence) -> list[int]:
        """The table's entries that hold blocks no later query of the sequence sees, but
        for the window before its prompt's last full block: the sequence keeps those
        until it ends, so that a request with the same prompt (a retry, n > 1, a
        batch) finds them in the cache the way it finds the global blocks.

        Blocks leave in order, a cache hit's table is NULL_BLOCK up to its window
        (take_cached) and a fork shares its parent's prompt, so left of the window (the
        prompt's window aside) a table is NULL_BLOCK up to the blocks that left since
        the last step: the scan goes down from the window's edge to the first
        NULL_BLOCK, a step's cost independent of the context's length."""
        if self.window is None:
            return []  # nothing leaves a group without a window
        table = self.table(seq)
        prompt_blocks = (seq.num_prompt_tokens - 1) // self.block_size
        prompt_window_start = self.first_kept(prompt_blocks * self.block_size)
        leaving = []
        i = self.first_kept(seq.num_computed_tokens) - 1
        while i >= 0:
            if prompt_window_start <= i < prompt_blocks:
                i = prompt_window_start - 1
            elif table[i] == self.null:
                break
            else:
                leaving.append(i)
                i -= 1
        return leaving[::-1]

    def _needs_copy_on_write(self, seq: Sequence, table: list[int]) -> bool:
        if not table or seq.num_computed_tokens % self.block_size == 0:
            return False
        last = seq.num_computed_tokens // self.block_size
        return last < len(table) and self.pool.is_shared(table[last])

    # ---- the prefix cache ----

    def register(
        self, seq: Sequence, hashes: list[int], start: int, token_ids: list[int]
    ) -> list[tuple[int, int, tuple[int, ...]]]:
        """Make the table's blocks ``start`` .. len(hashes) findable by their hashes;
        the (block, hash, tokens) of those that were not yet."""
        table = self.table(seq)
        bs = self.block_size
        registered = []
        for i in range(start, len(hashes)):
            if table[i] != self.null:
                tokens = tuple(token_ids[i * bs : (i + 1) * bs])
                if self.pool.register(table[i], hashes[i], tokens):
                    registered.append((table[i], hashes[i], tokens))
        return registered

    def find_cached(
        self, hashes: list[int], token_ids: list[int], tiers: PrefixTiers | None = None
    ) -> list[Any]:
        """Per hashed block, its cached block in this group's pool, or else the tiers'
        host slot that holds it, or None; without a window, only up to the first miss
        (nothing after it is usable)."""
        bs = self.block_size
        found: list[Any] = []
        for i, block_hash in enumerate(hashes):
            found.append(self.pool.find_cached(block_hash, tuple(token_ids[i * bs : (i + 1) * bs])))
            if found[-1] is None and self.window is None and tiers is None:
                break
        if tiers is not None:
            found = tiers.find(self.index, found, hashes, token_ids, self.window is not None)
        return found

    def usable_prefix(self, found: list[int | None]) -> int:
        """The most leading blocks a new sequence can take from the cache: computing on
        from block k needs the cached blocks of the window before it (of every block
        before it, without a window)."""
        run = 0  # cached blocks in a row, ending at block k - 1
        best = 0
        for k in range(1, len(found) + 1):
            run = run + 1 if found[k - 1] is not None else 0
            if self.window is None and run < k:
                break
            if run >= k - self.first_kept(k * self.block_size):
                best = k
        return best

    def can_take(self, found: list[Any], num_blocks: int) -> bool:
        """Whether ``take_cached`` can take the first ``num_blocks`` of ``found`` now:
        each block from host RAM needs a fresh block of the pool, and each cached block
        no sequence holds leaves the free list, so together they must fit in the free
        blocks; and the window before a shorter prefix must be there too."""
        kept = self.first_kept(num_blocks * self.block_size)
        taken = found[kept:num_blocks]
        if len(taken) < num_blocks - kept or any(entry is None for entry in taken):
            return False
        blocks = self.pool.blocks
        needed = sum(1 for e in taken if not isinstance(e, int) or blocks[e].ref_count == 0)
        return needed <= self.pool.num_free_blocks

    def take_cached(
        self,
        seq: Sequence,
        found: list[Any],
        num_blocks: int,
        tiers: PrefixTiers | None = None,
    ) -> list[Registered]:
        """Start the sequence's table with the first ``num_blocks`` cached blocks (those
        left of the window as NULL_BLOCK). An entry that is not a block id is a tier's
        (engine/kv/): the tiers give it a fresh block, once the pool's hits are taken,
        so that handing out that block never evicts one of them. Returns (block, hash,
        tokens) of those, which the pool holds again."""
        kept = self.first_kept(num_blocks * self.block_size)
        table = [self.null] * kept
        from_tier = []
        for i, entry in enumerate(found[kept:num_blocks], kept):
            assert entry is not None
            if isinstance(entry, int):
                self.pool.take(entry)
            else:
                from_tier.append(i)
            table.append(entry)
        loaded = []
        for i in from_tier:
            assert tiers is not None
            table[i] = tiers.load(self.index, self.pool, found[i])
            block = self.pool.blocks[table[i]]
            loaded.append((table[i], block.block_hash, block.token_ids))
        self.set_table(seq, table)
        return loaded

    # ---- swap ----

    def num_resident(self, seq: Sequence) -> int:
        return sum(1 for block_id in self.table(seq) if block_id != self.null)

    def can_swap_out(self, seq: Sequence) -> bool:
        return self.num_resident(seq) <= len(self.pool.free_cpu_blocks)

    def swap_out(self, seq: Sequence) -> list[BlockPair]:
        """Move the sequence's blocks to CPU blocks; return (gpu, cpu) copies."""
        table = self.table(seq)
        cpu_table = [
            self.null if block_id == self.null else self.pool.free_cpu_blocks.pop()
            for block_id in table
        ]
        mapping = [pair for pair in zip(table, cpu_table, strict=True) if pair[0] != self.null]
        self.free(seq)
        self.set_table(seq, cpu_table)
        return mapping

    def blocks_to_swap_in(self, seq: Sequence, num_new_tokens: int) -> int:
        total = seq.num_computed_tokens + num_new_tokens
        return self.num_resident(seq) + max(0, -(-total // self.block_size) - len(self.table(seq)))

    def swap_in(self, seq: Sequence) -> list[BlockPair]:
        """Bring a swapped sequence's blocks back; return (cpu, gpu) copies."""
        cpu_table = self.table(seq)
        table = [
            self.null if block_id == self.null else self.pool.pop_free() for block_id in cpu_table
        ]
        mapping = [pair for pair in zip(cpu_table, table, strict=True) if pair[0] != self.null]
        self.pool.free_cpu_blocks.extend(cpu for cpu, _ in reversed(mapping))
        self.set_table(seq, table)
        return mapping

    def free_swapped(self, seq: Sequence) -> None:
        """Release the CPU blocks of a swapped sequence."""
        self.pool.free_cpu_blocks.extend(b for b in reversed(self.table(seq)) if b != self.null)
        self.set_table(seq, [])
