"""SlotIndex, the RAM tier's bookkeeping: which slot a block is in, which slot a save
takes (free ones first, then the least recently used entry no move of this step
touches), and how many slots a burst of reads may take."""

from __future__ import annotations

from hetero_infer.engine.kv.tier_index import SlotIndex

TOKENS = (1, 2, 3, 4)


def filled(num_slots: int) -> SlotIndex:
    """Every slot holding a block (hash = slot + 100), none busy."""
    index = SlotIndex(num_slots)
    for _ in range(num_slots):
        slot = index.allocate()
        index.put(slot + 100, slot, TOKENS)
    index.end_step()
    return index


def test_free_slots_go_first_in_order():
    index = SlotIndex(3)
    assert [index.allocate() for _ in range(3)] == [0, 1, 2]
    assert index.allocate() is None  # all busy, none held


def test_the_least_recently_used_entry_not_busy_is_taken():
    index = filled(3)
    removed = []
    index.on_removed = removed.append
    assert index.find(100, TOKENS) == 0  # 100 is now the most recently used
    index.use(1)  # a move of this step reads slot 1
    assert index.allocate() == 2 and removed == [102]
    assert index.allocate() == 0 and removed == [102, 100]
    assert index.allocate() is None  # slot 1 is busy
    index.end_step()
    assert index.allocate() == 1


def test_a_hash_with_other_tokens_is_not_found():
    index = filled(2)
    assert index.find(101, TOKENS) == 1
    assert index.find(101, (1, 2, 3, 5)) is None
    assert index.find(7, TOKENS) is None


def test_reads_may_take_free_slots_and_entries_not_busy():
    index = filled(3)
    index.release(index.entries.pop(102)[0])  # one free slot, two held
    assert index.num_available == 3
    index.use(0)
    assert index.num_available == 2
    index.forget()
    assert sorted(index.free_slots) == [0, 1, 2] and not index.entries
