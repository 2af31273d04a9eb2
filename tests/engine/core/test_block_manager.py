"""BlockManager unit tests: allocation, ref counts, prefix caching, copy-on-write, swap.

Pure Python. "Computing" tokens is simulated the way the scheduler does it:
``allocate_slots``, then advance ``num_computed_tokens``, then ``register_full_blocks``.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.params.image_input import ImageInput
from hetero_infer.engine.params.pooling_params import PoolingParams
from hetero_infer.engine.params.sampling_params import SamplingParams

BLOCK_SIZE = 4


def make_seq(request_id: str, token_ids: list[int]) -> Sequence:
    return Sequence(request_id, list(token_ids), SamplingParams(max_tokens=16))


def compute(bm: BlockManager, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
    """Allocate for and 'run' the next tokens of ``seq``; return the copy-on-write pairs."""
    copies = bm.allocate_slots(seq, num_new_tokens)
    seq.num_computed_tokens += num_new_tokens
    bm.register_full_blocks(seq)
    return copies


def prefill(bm: BlockManager, seq: Sequence) -> None:
    compute(bm, seq, seq.num_uncomputed_tokens)


def refs(bm: BlockManager, block_ids: list[int]) -> list[int]:
    return [bm.blocks[b].ref_count for b in block_ids]


# ---- allocation and free ----


def test_fresh_manager_is_all_free() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, num_cpu_blocks=3)
    stats = bm.memory_stats()
    assert stats["total_blocks"] == 8
    assert stats["free_blocks"] == 8
    assert stats["used_blocks"] == 0
    assert stats["usage"] == 0.0
    assert stats["cpu_total_blocks"] == 3
    assert stats["cpu_used_blocks"] == 0
    assert stats["prefix_cache_hit_rate"] == 0.0


@pytest.mark.parametrize(
    ("num_tokens", "num_blocks"), [(1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (10, 3)]
)
def test_allocate_rounds_up_to_whole_blocks(num_tokens: int, num_blocks: int) -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    seq = make_seq("a", list(range(num_tokens)))
    assert bm.num_blocks_needed(seq, num_tokens) == num_blocks
    assert bm.allocate_slots(seq, num_tokens) == []
    assert len(seq.block_table) == num_blocks
    assert len(set(seq.block_table)) == num_blocks
    assert refs(bm, seq.block_table) == [1] * num_blocks
    assert bm.num_used_blocks == num_blocks
    assert bm.num_free_blocks == 8 - num_blocks
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks


def test_decode_allocates_a_block_only_at_a_boundary() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    seq = make_seq("a", list(range(6)))
    prefill(bm, seq)
    assert len(seq.block_table) == 2
    for token in (6, 7):  # positions 6 and 7 still fit in block 1
        seq.token_ids.append(token)
        assert bm.num_blocks_needed(seq, 1) == 0
        compute(bm, seq, 1)
        assert len(seq.block_table) == 2
    seq.token_ids.append(8)  # position 8 opens block 2
    assert bm.num_blocks_needed(seq, 1) == 1
    compute(bm, seq, 1)
    assert len(seq.block_table) == 3


def test_chunks_grow_the_table_incrementally() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    seq = make_seq("a", list(range(11)))
    compute(bm, seq, 3)
    assert len(seq.block_table) == 1
    compute(bm, seq, 3)
    assert len(seq.block_table) == 2
    compute(bm, seq, 5)
    assert len(seq.block_table) == 3
    assert seq.num_computed_tokens == 11


def test_can_allocate_slots_is_false_when_blocks_run_out() -> None:
    bm = BlockManager(num_blocks=3, block_size=BLOCK_SIZE)
    a = make_seq("a", list(range(8)))
    prefill(bm, a)
    b = make_seq("b", list(range(100, 108)))
    assert bm.num_blocks_needed(b, 8) == 2
    assert not bm.can_allocate_slots(b, 8)
    assert bm.can_allocate_slots(b, 4)


def test_free_returns_every_block() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    seq = make_seq("a", list(range(10)))
    prefill(bm, seq)
    table = list(seq.block_table)
    bm.free(seq)
    assert seq.block_table == []
    assert seq.num_registered_blocks == 0
    assert refs(bm, table) == [0, 0, 0]
    assert bm.num_free_blocks == 8
    assert set(bm.free_blocks) == set(range(8))
    bm.free(seq)  # a second free of an emptied table is a no-op
    assert bm.num_free_blocks == 8


def test_two_sequences_get_disjoint_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    a, b = make_seq("a", list(range(9))), make_seq("b", list(range(100, 109)))
    prefill(bm, a)
    prefill(bm, b)
    assert not set(a.block_table) & set(b.block_table)
    assert bm.num_used_blocks == 6


def test_double_release_is_caught() -> None:
    bm = BlockManager(num_blocks=4, block_size=BLOCK_SIZE)
    seq = make_seq("a", [1, 2, 3])
    prefill(bm, seq)
    stale = make_seq("stale", [1, 2, 3])
    stale.block_table = list(seq.block_table)
    bm.free(seq)
    with pytest.raises(AssertionError, match="freed twice"):
        bm.free(stale)


# ---- prefix caching ----


def test_full_computed_blocks_are_registered_with_chained_hashes() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    seq = make_seq("a", list(range(10)))
    prefill(bm, seq)
    assert seq.num_registered_blocks == 2  # the partial third block is not hashed
    b0, b1, b2 = (bm.blocks[i] for i in seq.block_table)
    assert b0.block_hash == bm.hasher.hash_block(None, (0, 1, 2, 3))
    assert b1.block_hash == bm.hasher.hash_block(b0.block_hash, (4, 5, 6, 7))
    assert b2.block_hash is None
    assert b0.token_ids == (0, 1, 2, 3)
    assert bm.cached_blocks == {b0.block_hash: b0.block_id, b1.block_hash: b1.block_id}
    assert bm.memory_stats()["cached_blocks"] == 2


def test_blocks_are_registered_only_once_computed() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    seq = make_seq("a", list(range(10)))
    bm.allocate_slots(seq, 10)  # allocated, but the step has not run
    bm.register_full_blocks(seq)
    assert bm.cached_blocks == {}
    seq.num_computed_tokens = 5
    bm.register_full_blocks(seq)
    assert len(bm.cached_blocks) == 1


def test_prefix_hit_shares_blocks_and_counts_as_computed() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    a = make_seq("a", list(range(10)))
    prefill(bm, a)
    b = make_seq("b", list(range(9)) + [99, 98])
    assert bm.allocate_cached_prefix(b) == 8
    assert b.num_computed_tokens == 8
    assert b.block_table == a.block_table[:2]
    assert refs(bm, a.block_table) == [2, 2, 1]
    assert bm.num_used_blocks == 3  # nothing new taken
    assert compute(bm, b, b.num_uncomputed_tokens) == []  # full shared blocks are never copied
    assert len(b.block_table) == 3
    assert b.block_table[2] != a.block_table[2]


@pytest.mark.parametrize(
    ("num_tokens", "num_hit"), [(1, 0), (4, 0), (5, 4), (8, 4), (9, 8), (12, 8), (13, 12)]
)
def test_prefix_hit_leaves_at_least_one_token_to_compute(num_tokens: int, num_hit: int) -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    a = make_seq("a", list(range(16)))
    prefill(bm, a)
    b = make_seq("b", list(range(num_tokens)))
    assert bm.allocate_cached_prefix(b) == num_hit
    assert b.num_uncomputed_tokens >= 1
    assert len(b.block_table) == num_hit // BLOCK_SIZE


def test_prefix_hit_needs_identical_tokens() -> None:
    bm = BlockManager(num_blocks=16, block_size=BLOCK_SIZE)
    a = make_seq("a", list(range(12)))
    prefill(bm, a)
    # First block differs: nothing, even though the second block's tokens match.
    b = make_seq("b", [0, 1, 2, 9] + list(range(4, 12)))
    assert bm.allocate_cached_prefix(b) == 0
    assert b.block_table == []
    # Second block differs: only the first block is reused.
    c = make_seq("c", [0, 1, 2, 3, 4, 5, 6, 9, 8, 9, 10, 11])
    assert bm.allocate_cached_prefix(c) == 4
    assert c.block_table == a.block_table[:1]
    # The same tokens shifted by one position are a different prefix.
    d = make_seq("d", [7] + list(range(12)))
    assert bm.allocate_cached_prefix(d) == 0


def test_prefix_hit_survives_free_until_the_block_is_reused() -> None:
    bm = BlockManager(num_blocks=4, block_size=BLOCK_SIZE)
    a = make_seq("a", list(range(9)))
    prefill(bm, a)
    table = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 4
    b = make_seq("b", list(range(9)))
    assert bm.allocate_cached_prefix(b) == 8
    assert b.block_table == table[:2]
    assert refs(bm, table[:2]) == [1, 1]
    assert bm.num_free_blocks == 2  # the hit blocks left the free list
    assert not set(b.block_table) & set(bm.free_blocks)


def test_hash_collision_is_not_a_hit() -> None:
    bm = BlockManager(num_blocks=4, block_size=BLOCK_SIZE)
    a = make_seq("a", list(range(5)))
    prefill(bm, a)
    b = make_seq("b", [9, 9, 9, 9, 9])
    # Pretend b's first block hashes to the block that holds a's tokens.
    bm.cached_blocks[bm.block_hashes(b, 1)[0]] = a.block_table[0]
    assert bm.allocate_cached_prefix(b) == 0
    assert b.block_table == []
    assert bm.blocks[a.block_table[0]].ref_count == 1


# Prints the hashes of two blocks of one prompt, as a fresh process computes them.
HASHES_IN_A_PROCESS = """
from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.params.sampling_params import SamplingParams

bm = BlockManager(num_blocks=4, block_size=4)
print(bm.block_hashes(Sequence("a", list(range(9)), SamplingParams()), 2))
"""


def test_block_hashes_differ_between_processes() -> None:
    """Keyed per process: the same blocks hash differently in another process (or
    replica), so a block's hash cannot be worked out, or crafted to collide, outside."""
    runs = [
        subprocess.run(
            [sys.executable, "-c", HASHES_IN_A_PROCESS], capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    ]
    first, second = (ast.literal_eval(out) for out in runs)
    assert len(first) == len(second) == 2
    assert not set(first) & set(second)


def test_block_hashes_are_stable_within_a_process() -> None:
    """... and the same within one: a later prompt with the same blocks hits them."""
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    a = make_seq("a", list(range(9)))
    b = make_seq("b", [*range(8), 42])
    assert bm.block_hashes(a, 2) == bm.block_hashes(b, 2)
    prefill(bm, a)
    assert bm.allocate_cached_prefix(b) == 8
    assert b.block_table == a.block_table[:2]
    other = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)  # another engine's cache
    assert other.block_hashes(make_seq("c", list(range(9))), 2) != bm.block_hashes(a, 2)


def test_prefix_caching_disabled() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, enable_prefix_caching=False)
    a = make_seq("a", list(range(9)))
    prefill(bm, a)
    assert bm.cached_blocks == {}
    assert all(bm.blocks[i].block_hash is None for i in a.block_table)
    b = make_seq("b", list(range(9)))
    assert bm.allocate_cached_prefix(b) == 0


@pytest.mark.parametrize("asks", ["prompt_logprobs", "mean_pooling"])
def test_a_sequence_that_needs_every_prompt_position_takes_nothing_cached(asks: str) -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    prefill(bm, make_seq("a", list(range(9))))
    if asks == "prompt_logprobs":
        b = Sequence("b", list(range(9)), SamplingParams(max_tokens=1, prompt_logprobs=0))
    else:
        mean = PoolingParams("mean")
        b = Sequence("b", list(range(9)), SamplingParams(max_tokens=1), pooling=mean)
    assert bm.allocate_cached_prefix(b) == 0
    assert b.num_computed_tokens == 0 and b.block_table == []


def test_unhashed_free_blocks_are_handed_out_before_cached_ones() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq("a", [1, 2, 3, 4, 5])  # two full blocks and a partial one
    prefill(bm, a)
    full0, full1, partial = a.block_table
    (never_used,) = bm.free_blocks
    bm.free(a)
    # The partial block holds nothing reusable: first out. Cached blocks go last,
    # the later block of a chain before the earlier one.
    assert list(bm.free_blocks) == [partial, never_used, full1, full0]
    c = make_seq("c", [7, 7, 7, 7, 7, 7])
    bm.allocate_slots(c, 6)
    assert c.block_table == [partial, never_used, full1]
    # full1 was evicted from the cache; full0 still serves a's first block.
    assert bm.blocks[full1].block_hash is None
    assert list(bm.cached_blocks.values()) == [full0]
    b = make_seq("b", [1, 2, 3, 4, 5])
    assert bm.allocate_cached_prefix(b) == 2
    assert b.block_table == [full0]


def test_a_reset_hands_out_the_blocks_written_before_first() -> None:
    """Their memory is resident; a never-written block's pages are faulted in when first
    written, which a reset between runs of new prompts need not pay again."""
    bm = BlockManager(num_blocks=8, block_size=2)
    a = make_seq("a", [1, 2, 3, 4, 5])
    prefill(bm, a)
    written = list(a.block_table)
    bm.free(a)
    assert list(bm.free_blocks)[-2:] == written[1::-1]  # cached: last, as evicted
    assert bm.reset_prefix_cache()
    assert sorted(list(bm.free_blocks)[:3]) == sorted(written)
    c = make_seq("c", [7, 8, 9, 10, 11, 12])
    prefill(bm, c)
    assert sorted(c.block_table) == sorted(written)


def test_least_recently_freed_cached_block_is_evicted_first() -> None:
    bm = BlockManager(num_blocks=2, block_size=2)
    a, b = make_seq("a", [1, 2]), make_seq("b", [3, 4])
    prefill(bm, a)
    prefill(bm, b)
    (a_block,), (b_block,) = a.block_table, b.block_table
    bm.free(a)
    bm.free(b)
    c = make_seq("c", [5, 6])
    bm.allocate_slots(c, 2)
    assert c.block_table == [a_block]
    assert list(bm.cached_blocks.values()) == [b_block]


def test_a_reused_cached_block_is_freed_as_most_recent() -> None:
    bm = BlockManager(num_blocks=2, block_size=2)
    a, b = make_seq("a", [1, 2]), make_seq("b", [3, 4])
    prefill(bm, a)
    prefill(bm, b)
    a_block, b_block = a.block_table[0], b.block_table[0]
    bm.free(a)
    bm.free(b)
    a2 = make_seq("a2", [1, 2, 9])
    assert bm.allocate_cached_prefix(a2) == 2  # a's block is touched again ...
    bm.free(a2)  # ... so it is now the most recently freed
    assert list(bm.free_blocks) == [b_block, a_block]


def test_hit_rate_stats() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    a = make_seq("a", list(range(9)))
    prefill(bm, a)
    bm.record_prefix_lookup(a.num_tokens, 0)
    b = make_seq("b", list(range(9)) + [50, 51, 52])
    hit = bm.allocate_cached_prefix(b)
    bm.record_prefix_lookup(b.num_tokens, hit)
    stats = bm.memory_stats()
    assert stats["prefix_cache_queries"] == 9 + 12
    assert stats["prefix_cache_hits"] == 8
    assert stats["prefix_cache_hit_rate"] == pytest.approx(8 / 21)


# ---- copy-on-write after fork ----


def test_fork_shares_every_block() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    parent = make_seq("p", list(range(6)))
    prefill(bm, parent)
    child = make_seq("c", list(range(6)))
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert child.block_table is not parent.block_table
    assert child.num_computed_tokens == parent.num_computed_tokens == 6
    assert refs(bm, parent.block_table) == [2, 2]
    assert bm.num_used_blocks == 2


def test_writer_copies_a_shared_partial_last_block() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    parent = make_seq("p", list(range(6)))  # block 1 holds positions 4, 5 of 4
    prefill(bm, parent)
    child = make_seq("c", list(range(6)))
    bm.fork(parent, child)
    full, shared = parent.block_table
    parent.token_ids.append(100)
    child.token_ids.append(200)

    assert bm.num_blocks_needed(parent, 1) == 1  # the private copy
    copies = compute(bm, parent, 1)
    (private,) = {b for b in parent.block_table} - {full, shared}
    assert copies == [(shared, private)]
    assert parent.block_table == [full, private]
    assert child.block_table == [full, shared]
    assert refs(bm, [full, shared, private]) == [2, 1, 1]

    # The child is now the only holder: it writes in place.
    assert bm.num_blocks_needed(child, 1) == 0
    assert compute(bm, child, 1) == []
    assert child.block_table == [full, shared]


def test_a_preempted_writers_copy_is_forgotten_and_no_other() -> None:
    """A sequence preempted in the step that copied its shared block into a block of its
    own frees that block, which the step may hand out again: its copy must not run."""
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    parent = make_seq("p", list(range(6)))
    prefill(bm, parent)
    children = [make_seq(f"c{i}", list(range(6))) for i in (1, 2)]
    for child in children:
        bm.fork(parent, child)
        child.token_ids.append(200)
    copies = [*bm.allocate_slots(children[0], 1), *bm.allocate_slots(children[1], 1)]
    assert len(copies) == 2
    bm.forget_copies_into(children[0], copies)
    assert copies == [(parent.block_table[1], children[1].block_table[1])]


def test_copy_on_write_plus_new_block_in_one_chunk() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    parent = make_seq("p", list(range(6)))
    prefill(bm, parent)
    child = make_seq("c", list(range(6)))
    bm.fork(parent, child)
    for t in range(4):
        parent.token_ids.append(100 + t)
    assert bm.num_blocks_needed(parent, 4) == 2  # one copy, one new block
    copies = compute(bm, parent, 4)
    assert len(copies) == 1 and copies[0][0] == child.block_table[1]
    assert len(parent.block_table) == 3
    assert bm.num_used_blocks == 4  # shared full, child's partial, the copy, the new one


def test_no_copy_when_fork_is_at_a_block_boundary() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    parent = make_seq("p", list(range(8)))
    prefill(bm, parent)
    child = make_seq("c", list(range(8)))
    bm.fork(parent, child)
    parent.token_ids.append(100)
    child.token_ids.append(200)
    assert compute(bm, parent, 1) == []
    assert compute(bm, child, 1) == []
    assert parent.block_table[:2] == child.block_table[:2]
    assert parent.block_table[2] != child.block_table[2]


def test_copy_on_write_needs_a_free_block() -> None:
    bm = BlockManager(num_blocks=2, block_size=BLOCK_SIZE)
    parent = make_seq("p", list(range(6)))
    prefill(bm, parent)
    child = make_seq("c", list(range(6)))
    bm.fork(parent, child)
    parent.token_ids.append(100)
    assert bm.num_free_blocks == 0
    assert not bm.can_allocate_slots(parent, 1)


def test_a_decode_with_room_in_its_blocks_needs_no_allocation() -> None:
    """has_room: the scheduler's short way for most decode steps, which must agree with
    allocate_slots taking nothing: no block, no copy."""
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    seq = make_seq("a", list(range(6)))  # 2 blocks, 2 free slots in the last
    prefill(bm, seq)
    assert bm.has_room(seq, 2) and not bm.has_room(seq, 3)
    for token in (100, 101):
        seq.token_ids.append(token)
        assert bm.has_room(seq, 1)
        assert compute(bm, seq, 1) == [] and len(seq.block_table) == 2
    seq.token_ids.append(102)
    assert not bm.has_room(seq, 1)  # its blocks are full: a new one
    # A shared, partly filled last block is copied before it is written to.
    parent = make_seq("p", list(range(6)))
    prefill(bm, parent)
    child = make_seq("c", list(range(6)))
    bm.fork(parent, child)
    parent.token_ids.append(100)
    assert not bm.has_room(parent, 1) and len(compute(bm, parent, 1)) == 1
    assert bm.has_room(parent, 1)  # its own copy now


def test_a_windowed_group_always_takes_the_long_way() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, later_groups=[(8, 8)])
    seq = make_seq("a", list(range(6)))
    prefill(bm, seq)
    seq.token_ids.append(100)
    # Blocks may leave its window at any step: allocate_slots gives them back.
    assert not bm.has_room(seq, 1)


def test_free_after_fork_keeps_the_other_holder() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    parent = make_seq("p", list(range(6)))
    prefill(bm, parent)
    child = make_seq("c", list(range(6)))
    bm.fork(parent, child)
    table = list(parent.block_table)
    bm.free(parent)
    assert refs(bm, table) == [1, 1]
    assert bm.num_used_blocks == 2
    bm.free(child)
    assert refs(bm, table) == [0, 0]
    assert bm.num_free_blocks == 8


# ---- swap ----


def test_swap_out_moves_blocks_to_cpu() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, num_cpu_blocks=4)
    seq = make_seq("a", list(range(10)))
    prefill(bm, seq)
    gpu_table = list(seq.block_table)
    assert bm.can_swap_out(seq)
    mapping = bm.swap_out(seq)
    assert [gpu for gpu, _ in mapping] == gpu_table
    cpu_table = [cpu for _, cpu in mapping]
    assert seq.block_table == cpu_table
    assert len(set(cpu_table)) == 3 and all(0 <= c < 4 for c in cpu_table)
    assert seq.num_computed_tokens == 10  # KV is kept, not dropped
    assert bm.num_free_blocks == 8
    assert refs(bm, gpu_table) == [0, 0, 0]
    assert bm.memory_stats()["cpu_used_blocks"] == 3
    assert len(bm.free_cpu_blocks) == 1


def test_swap_out_needs_enough_cpu_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, num_cpu_blocks=2)
    seq = make_seq("a", list(range(10)))
    prefill(bm, seq)
    assert not bm.can_swap_out(seq)
    exact = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, num_cpu_blocks=3)
    seq = make_seq("a", list(range(10)))
    prefill(exact, seq)
    assert exact.can_swap_out(seq)  # its 3 blocks, 3 CPU blocks
    no_swap = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    other = make_seq("b", [1])
    prefill(no_swap, other)
    assert not no_swap.can_swap_out(other)


def test_swap_in_brings_blocks_back() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, num_cpu_blocks=4)
    seq = make_seq("a", list(range(10)))
    prefill(bm, seq)
    bm.swap_out(seq)
    cpu_table = list(seq.block_table)
    seq.token_ids.append(10)
    assert bm.can_swap_in(seq, 1)
    mapping = bm.swap_in(seq)
    assert [cpu for cpu, _ in mapping] == cpu_table
    gpu_table = [gpu for _, gpu in mapping]
    assert seq.block_table == gpu_table
    assert refs(bm, gpu_table) == [1, 1, 1]
    assert bm.num_used_blocks == 3
    assert bm.memory_stats()["cpu_used_blocks"] == 0
    assert sorted(bm.free_cpu_blocks) == [0, 1, 2, 3]
    # Swapped-in blocks hold no hash until the next registration.
    assert seq.num_registered_blocks == 0
    compute(bm, seq, 1)
    assert seq.num_registered_blocks == 2
    assert bm.blocks[gpu_table[0]].block_hash == bm.hasher.hash_block(None, (0, 1, 2, 3))


def test_can_swap_in_counts_the_new_tokens() -> None:
    bm = BlockManager(num_blocks=4, block_size=BLOCK_SIZE, num_cpu_blocks=4)
    seq = make_seq("a", list(range(8)))
    prefill(bm, seq)
    bm.swap_out(seq)
    seq.token_ids.append(8)
    hog = make_seq("hog", list(range(100, 108)))
    prefill(bm, hog)  # 2 of 4 GPU blocks left; seq needs 3 for position 8
    assert not bm.can_swap_in(seq, 1)
    bm.free(hog)
    assert bm.can_swap_in(seq, 1)


def test_swap_out_of_shared_blocks_keeps_them_for_the_other_holder() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, num_cpu_blocks=4)
    parent = make_seq("p", list(range(6)))
    prefill(bm, parent)
    child = make_seq("c", list(range(6)))
    bm.fork(parent, child)
    gpu_table = list(parent.block_table)
    mapping = bm.swap_out(child)
    assert [gpu for gpu, _ in mapping] == gpu_table
    assert refs(bm, gpu_table) == [1, 1]
    assert parent.block_table == gpu_table


def test_swapped_out_cached_blocks_stay_findable() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, num_cpu_blocks=4)
    a = make_seq("a", list(range(9)))
    prefill(bm, a)
    gpu_table = list(a.block_table)
    bm.swap_out(a)
    b = make_seq("b", list(range(9)))
    assert bm.allocate_cached_prefix(b) == 8
    assert b.block_table == gpu_table[:2]


def test_free_swapped_returns_cpu_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, num_cpu_blocks=4)
    a, b = make_seq("a", list(range(5))), make_seq("b", list(range(100, 103)))
    prefill(bm, a)
    prefill(bm, b)
    bm.swap_out(a)
    bm.swap_out(b)
    assert bm.memory_stats()["cpu_used_blocks"] == 3
    bm.free_swapped(a)
    assert a.block_table == []
    assert bm.memory_stats()["cpu_used_blocks"] == 1
    assert not set(bm.free_cpu_blocks) & set(b.block_table)
    bm.free_swapped(b)
    assert sorted(bm.free_cpu_blocks) == [0, 1, 2, 3]
    assert bm.num_free_blocks == 8


# ---- images in the prefix cache ----


def test_blocks_holding_an_image_hash_its_content() -> None:
    """The blocks before an image are shared by prompts with other images; the blocks
    that hold its placeholder tokens, and all after them, only with the same image."""
    tokens = list(range(100, 112)) + [7] * 6 + list(range(200, 208))  # image at 12..17
    positions = tuple(range(12, 18))

    def seq_with(request_id: str, content_hash: int) -> Sequence:
        image = ImageInput(content_hash, None, positions)
        return Sequence(request_id, tokens, SamplingParams(max_tokens=4), images=(image,))

    bm = BlockManager(num_blocks=32, block_size=BLOCK_SIZE)
    prefill(bm, first := seq_with("a", 1))
    # Blocks 0-2 (tokens 0-11) hold no image token: the other image finds them.
    assert bm.allocate_cached_prefix(seq_with("b", 2)) == 12
    # The same image finds every full block but the last, whose token is computed.
    assert bm.allocate_cached_prefix(seq_with("c", 1)) == 24
    assert first.block_hashes[:3] == bm.block_hashes(seq_with("d", 2), 3)
