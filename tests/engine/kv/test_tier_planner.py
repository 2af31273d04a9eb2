"""TierPlanner is what the scheduling core drives as its PrefixTiers: every method the
protocol names, with the protocol's parameters (the core types against the protocol
alone, so nothing else would catch a method renamed or a parameter added on one side).
Then its decisions, one at a time (most over a real block manager): what is saved
and written, what a lookup counts, what comes back from host RAM, and what is read
from disk."""

from __future__ import annotations

import inspect
from collections.abc import Iterable

import pytest
from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.block_pool import BlockPool
from hetero_infer.engine.core.prefix_tiers import PrefixTiers
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.kv.disk_layout import DiskLayout
from hetero_infer.engine.kv.tier_planner import TierPlanner
from hetero_infer.engine.params.sampling_params import SamplingParams

from tests.engine.core.test_block_manager import compute, make_seq

PROTOCOL_METHODS = sorted(
    name
    for name, _ in inspect.getmembers(PrefixTiers, inspect.isfunction)
    if not name.startswith("_")
)


def test_the_protocol_names_what_the_core_calls():
    assert len(PROTOCOL_METHODS) >= 10, PROTOCOL_METHODS


@pytest.mark.parametrize("name", PROTOCOL_METHODS)
def test_the_planner_has_each_method_with_the_protocols_parameters(name):
    wanted = inspect.signature(getattr(PrefixTiers, name)).parameters
    has = inspect.signature(getattr(TierPlanner, name)).parameters
    assert list(has) == list(wanted)


def test_forgetting_host_blocks_frees_every_slot():
    planner = TierPlanner(num_groups=2, num_slots=3, block_size=4, disk=None)
    for group in (0, 1):
        for block_hash in (10, 11, 12):
            planner.save(group, block_id=block_hash, block_hash=block_hash, token_ids=(1, 2, 3, 4))
    planner.take_moves()
    assert planner.stats()["kv_tier_ram_blocks"] == 6
    planner.forget_host_blocks()
    assert planner.stats()["kv_tier_ram_blocks"] == 0
    assert planner.find(0, [None], [10], [1, 2, 3, 4], window=False) == [None]
    assert all(index.num_available == 3 for index in planner.indexes)


BS = 4
TOKENS = list(range(100, 100 + 5 * BS + 1))  # five full blocks and one token more
HASHES = [900 + i for i in range(5)]


def block(i: int) -> tuple[int, ...]:
    return tuple(TOKENS[i * BS : (i + 1) * BS])


def saved(planner: TierPlanner, *blocks: int, group: int = 0) -> None:
    """Blocks ``blocks`` of TOKENS evicted into a group's host RAM, in a step of their own."""
    for i in blocks:
        planner.save(group, block_id=i, block_hash=HASHES[i], token_ids=block(i))
    planner.take_moves()


def tier_counts(planner: TierPlanner) -> dict[str, int]:
    names = ("ram_hits", "ram_misses", "queried_tokens", "hit_tokens")
    return {name: planner.stats()[f"kv_tier_{name}"] for name in names}


def test_a_save_with_every_slot_busy_is_dropped_and_counted():
    """Two slots: a third save in the same step finds both busy (their bytes are yet to
    be copied), so it is dropped; from the next step on it takes the oldest one."""
    planner = TierPlanner(num_groups=1, num_slots=2, block_size=BS, disk=None)
    for i in (0, 1, 2):
        planner.save(0, block_id=i, block_hash=HASHES[i], token_ids=block(i))
    [moves] = planner.take_moves()
    assert moves.save == [(0, 0), (1, 1)]
    assert planner.stats()["kv_tier_saves_dropped"] == 1
    planner.save(0, block_id=2, block_hash=HASHES[2], token_ids=block(2))
    [moves] = planner.take_moves()
    assert moves.save == [(2, 0)]
    found = planner.find(0, [None] * 3, HASHES[:3], TOKENS, window=True)
    assert [None if hit is None else hit.slot for hit in found] == [None, 1, 0]
    assert planner.stats()["kv_tier_saves_dropped"] == 1


def test_saves_and_new_blocks_go_to_disk_only_where_no_file_is(tmp_path):
    disk = DiskLayout(tmp_path, "model")
    disk.group_folder(0).mkdir(parents=True)
    disk.path(0, HASHES[1]).touch()
    planner = TierPlanner(num_groups=1, num_slots=4, block_size=BS, disk=disk)
    planner.save(0, block_id=10, block_hash=HASHES[0], token_ids=block(0))
    planner.save(0, block_id=11, block_hash=HASHES[1], token_ids=block(1))
    planner.persist(0, [(12, HASHES[2], block(2)), (13, HASHES[1], block(1))])
    [moves] = planner.take_moves()
    assert moves.save == [(10, 0), (11, 1)]
    assert moves.write == [(0, HASHES[0], block(0))]
    assert moves.persist == [(12, HASHES[2], block(2))]


def test_a_lookup_counts_what_reached_past_the_pool():
    """Block 0 in the pool, 1 and 2 in host RAM, 3 nowhere (4 in RAM, past the miss):
    the tiers were asked for every token after the pool's block, served two blocks and
    missed one; the next lookup counts afresh."""
    planner = TierPlanner(num_groups=1, num_slots=4, block_size=BS, disk=None)
    saved(planner, 1, 2, 4)
    found = planner.find(0, [7, None, None, None, None], HASHES, TOKENS, window=False)
    assert found[0] == 7 and found[3:] == [None]
    assert [hit.block_hash for hit in found[1:3]] == HASHES[1:3]
    pool = BlockPool(8)
    loaded = [planner.load(0, pool, hit) for hit in found[1:3]]
    assert [pool.find_cached(HASHES[i], block(i)) for i in (1, 2)] == loaded
    planner.record_lookup(len(TOKENS), 3 * BS)
    counts = {"ram_hits": 2, "ram_misses": 1, "queried_tokens": len(TOKENS) - BS}
    assert counts | {"hit_tokens": 2 * BS} == tier_counts(planner)

    # Every block in the pool: the tiers were asked for the last token alone.
    assert planner.find(0, [7, 8], HASHES[:2], TOKENS, window=False) == [7, 8]
    planner.record_lookup(2 * BS + 1, 2 * BS)
    counts["queried_tokens"] += 1
    assert counts | {"hit_tokens": 2 * BS} == tier_counts(planner)


@pytest.mark.parametrize("held_blocks, affordable", [(4, 4), (5, 3), (7, 1), (8, 0)])
def test_host_ram_hits_shrink_to_the_free_blocks(held_blocks, affordable):
    """Each block brought back from host RAM takes a free block of the pool: a busy pool
    takes a shorter prefix, down to none."""
    planner = TierPlanner(num_groups=1, num_slots=4, block_size=BS, disk=None)
    bm = BlockManager(num_blocks=8, block_size=BS, tiers=planner)
    compute(bm, make_seq("held", list(range(held_blocks * BS))), held_blocks * BS)
    saved(planner, 0, 1, 2, 3)
    found = planner.find(0, [None] * 4, HASHES[:4], TOKENS, window=False)
    assert planner.affordable(bm.groups, [found], 4) == affordable


def disk_manager(tmp_path, num_slots: int = 8, **options) -> BlockManager:
    """A block manager whose tiers have ``num_slots`` host slots and a disk."""
    planner = TierPlanner(1, num_slots, BS, DiskLayout(tmp_path, "model"))
    return BlockManager(num_blocks=16, block_size=BS, tiers=planner, **options)


def on_disk(bm: BlockManager, seq: Sequence, blocks: Iterable[int]) -> list[int]:
    """Files for the sequence's blocks ``blocks``; every full block's hash."""
    hashes = bm.block_hashes(seq, (seq.num_tokens - 1) // BS)
    bm.tiers.disk.group_folder(0).mkdir(parents=True, exist_ok=True)
    for i in blocks:
        bm.tiers.disk.path(0, hashes[i]).touch()
    return hashes


@pytest.mark.parametrize("num_slots, num_read", [(16, 5), (4, 2), (2, 1)])
def test_a_prefix_on_disk_is_read_a_step_ahead(tmp_path, num_slots, num_read):
    """Every full block of the prompt is on disk: the sequence waits a step while they
    are read into host slots, at most half of them at once (a burst must not evict the
    blocks it reads), then takes them; it waits only once."""
    bm = disk_manager(tmp_path, num_slots)
    seq = make_seq("a", TOKENS)
    hashes = on_disk(bm, seq, range(5))
    assert bm.waits_for_tier_reads(seq)
    [moves] = bm.take_tier_moves()
    assert [(h, tokens) for _, h, tokens in moves.read] == [
        (hashes[i], block(i)) for i in range(num_read)
    ]
    bm.tier_reads_done(tuple((0, h, True) for _, h, _ in moves.read))
    assert not bm.waits_for_tier_reads(seq)
    assert bm.allocate_cached_prefix(seq) == num_read * BS
    assert bm.tiers.stats()["kv_tier_disk_hits"] == num_read


def test_only_blocks_past_the_pool_and_host_ram_are_read(tmp_path):
    """Every block on disk, block 0 in the pool as well and block 1 in host RAM: the
    files of blocks 2-4 alone are read, and the sequence then takes all five."""
    bm = disk_manager(tmp_path)
    first = make_seq("first", TOKENS[: BS + 1])
    compute(bm, first, BS + 1)
    bm.free(first)
    seq = make_seq("a", TOKENS)
    hashes = on_disk(bm, seq, range(5))
    bm.tiers.save(0, block_id=9, block_hash=hashes[1], token_ids=block(1))
    bm.take_tier_moves()
    assert bm.waits_for_tier_reads(seq)
    [moves] = bm.take_tier_moves()
    assert [h for _, h, _ in moves.read] == hashes[2:]
    bm.tier_reads_done(tuple((0, h, True) for h in hashes[2:]))
    assert not bm.waits_for_tier_reads(seq)
    assert bm.allocate_cached_prefix(seq) == 5 * BS


def test_only_a_sequence_that_may_take_cached_blocks_waits_for_reads(tmp_path):
    """Prompt logprobs need every prompt position computed, and without prefix caching
    nothing is taken from the cache: neither waits for files it would not use."""
    logprobs = Sequence("p", TOKENS, SamplingParams(max_tokens=4, prompt_logprobs=1))
    bm = disk_manager(tmp_path)
    on_disk(bm, logprobs, range(5))
    assert not bm.waits_for_tier_reads(logprobs)
    bm = disk_manager(tmp_path, enable_prefix_caching=False)
    assert not bm.waits_for_tier_reads(make_seq("a", TOKENS))
    assert not bm.take_tier_moves()


def test_a_bad_file_is_a_miss_and_never_asked_for_again(tmp_path):
    """Blocks 0 and 1 on disk, block 1's file found bad as it is read: that read is a
    miss, the sequence takes block 0 alone, and a later lookup counts block 1 as missing
    from disk rather than read its file again."""
    bm = disk_manager(tmp_path)
    seq = make_seq("a", TOKENS)
    hashes = on_disk(bm, seq, range(2))
    assert bm.waits_for_tier_reads(seq)
    [moves] = bm.take_tier_moves()
    bm.tier_reads_done(((0, hashes[0], True), (0, hashes[1], False)))
    assert not bm.waits_for_tier_reads(seq)
    assert bm.allocate_cached_prefix(seq) == BS
    bm.record_prefix_lookup(seq.num_tokens, BS)
    stats = bm.tiers.stats()
    assert (stats["kv_tier_disk_hits"], stats["kv_tier_disk_misses"]) == (1, 1)
    bm.free(seq)
    other = make_seq("b", TOKENS)
    assert not bm.waits_for_tier_reads(other)  # block 0 in the pool, block 1 refused
    assert bm.allocate_cached_prefix(other) == BS
    bm.record_prefix_lookup(other.num_tokens, BS)
    assert bm.tiers.stats()["kv_tier_disk_misses"] == 2


WINDOW = 8  # a second KV cache group's sliding window: 2 or 3 blocks


def two_group_manager(
    tmp_path, group_blocks: tuple[int, int] = (32, 32), num_slots: int = 16
) -> BlockManager:
    """A first group and a windowed second one, with host slots and a disk."""
    planner = TierPlanner(2, num_slots, BS, DiskLayout(tmp_path, "model"))
    num_blocks, window_blocks = group_blocks
    later = [(WINDOW, window_blocks)]
    return BlockManager(num_blocks, block_size=BS, later_groups=later, tiers=planner)


@pytest.mark.parametrize(
    "window_files, num_slots, read",
    [
        # The window's group reads only the blocks a query after the prefix sees.
        (range(5), 16, {0: [0, 1, 2, 3, 4], 1: [3, 4]}),
        # Its later blocks are nowhere: the prefix ends where its window does.
        (range(2), 16, {0: [0, 1], 1: [0, 1]}),
        # Eight slots a group: the first group's five blocks are more than half.
        (range(5), 8, {0: [0, 1, 2, 3], 1: [2, 3]}),
    ],
)
def test_each_group_reads_what_the_shortest_usable_prefix_needs(
    tmp_path, window_files, num_slots, read
):
    bm = two_group_manager(tmp_path, num_slots=num_slots)
    seq = make_seq("a", TOKENS)
    hashes = on_disk(bm, seq, range(5))
    bm.tiers.disk.group_folder(1).mkdir(parents=True)
    for i in window_files:
        bm.tiers.disk.path(1, hashes[i]).touch()
    assert bm.waits_for_tier_reads(seq)
    moves = bm.take_tier_moves()
    assert {m.group: [hashes.index(h) for _, h, _ in m.read] for m in moves} == read


def test_the_busiest_group_decides_what_comes_back_from_host_ram(tmp_path):
    """Every block in both groups' host RAM; the windowed group's pool has one block
    free, and a prefix of two blocks or more needs two of its window: one block comes
    back, however many the first group has free."""
    bm = two_group_manager(tmp_path, group_blocks=(32, 6))
    held = make_seq("held", list(range(4 * BS)))
    compute(bm, held, 4 * BS)
    assert bm.groups[1].pool.num_free_blocks == 1
    for group in (0, 1):
        saved(bm.tiers, 0, 1, 2, 3, group=group)
    found = [bm.tiers.find(g, [None] * 4, HASHES[:4], TOKENS, window=g == 1) for g in (0, 1)]
    assert bm.tiers.affordable(bm.groups, found, 4) == 1


def test_a_stop_writes_every_block_the_disk_lacks(tmp_path):
    """The pool's cached blocks and host RAM's, except those with files."""
    bm = disk_manager(tmp_path)
    seq = make_seq("a", TOKENS)
    compute(bm, seq, seq.num_tokens)
    hashes = on_disk(bm, seq, [1, 3])
    saved(bm.tiers, 0, 1)
    bm.tiers.disk.path(0, HASHES[1]).touch()
    [moves] = bm.tiers.unsaved_moves([group.pool for group in bm.groups])
    table = seq.block_table
    assert moves.persist == [(table[i], hashes[i], block(i)) for i in (0, 2, 4)]
    assert moves.write == [(0, HASHES[0], block(0))]
