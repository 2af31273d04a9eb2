"""The sliding-window layers' KV cache group: blocks that leave the window go back to
their pool, prefix hits need the window before them, and fork, swap and free carry the
group's table (its null entries included). Pure Python, simulated as in
test_block_manager.py: allocate, advance ``num_computed_tokens``, register."""

from __future__ import annotations

import random

import pytest
from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.block_pool import NULL_BLOCK
from hetero_infer.engine.kv.tier_planner import TierHit, TierPlanner
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.worker.kv_sizing import pool_sizes, windowed_blocks_needed

from tests.engine.core.test_block_manager import compute, make_seq

BS = 4
WINDOW = 8  # a query sees itself and the 7 keys before it: 2 or 3 blocks


def manager(num_sliding_blocks: int = 32, num_cpu_blocks: int = 0) -> BlockManager:
    return BlockManager(
        num_blocks=64,
        block_size=BS,
        num_cpu_blocks=num_cpu_blocks,
        later_groups=[(WINDOW, num_sliding_blocks)],
    )


def resident(table: list[int]) -> list[int]:
    return [b for b in table if b != NULL_BLOCK]


def sliding_used(bm: BlockManager) -> int:
    return bm.memory_stats()["group1_used_blocks"]


def test_blocks_leave_the_window_as_decoding_goes_on() -> None:
    bm = manager()
    seq = make_seq("a", list(range(10, 30)))  # 20 tokens: 5 blocks
    compute(bm, seq, 20)
    assert len(resident(seq.block_tables[1])) == 5  # a prefill's chunk keeps its blocks
    for step in range(40):
        seq.token_ids.append(100 + step)
        compute(bm, seq, 1)
        # The next query (at num_computed) sees positions num_computed - 7 onwards.
        first_kept = max(0, seq.num_computed_tokens - WINDOW + 1) // BS
        table = seq.block_tables[1]
        # Freed a step later, but for the window before the prompt's last full block
        # (blocks 2 and 3), which the sequence keeps for requests with its prompt.
        left = [i for i in range(first_kept - 1) if i not in (2, 3)]
        assert all(table[i] == NULL_BLOCK for i in left)
        assert NULL_BLOCK not in (table[2], table[3])
        assert len(resident(table)) <= -(-(WINDOW - 1) // BS) + 2 + 2
        assert len(seq.block_table) == -(-seq.num_computed_tokens // BS)  # global keeps all
    assert sliding_used(bm) <= 6 and bm.num_used_blocks == 15
    bm.free(seq)
    assert sliding_used(bm) == 0 and bm.num_used_blocks == 0


def test_the_first_kept_block_holds_the_window_s_first_key() -> None:
    group = manager().groups[1]
    # A query at p sees p - 7 .. p; block b holds positions 4b .. 4b + 3.
    assert [group.first_kept(p) for p in (0, 7, 10, 11, 14, 15)] == [0, 0, 0, 1, 1, 2]


def test_a_block_leaving_the_window_pays_for_the_next_one() -> None:
    """A chunk that needs a new block as one leaves the window takes none from the pool,
    unless the leaving block is shared (another sequence keeps it)."""
    bm = manager()
    group = bm.groups[1]
    seq = make_seq("a", [10, 11, 12])  # less than a block: none kept for the prompt
    compute(bm, seq, 3)
    for step in range(8):
        seq.token_ids.append(100 + step)
        compute(bm, seq, 1)
    seq.token_ids += [200, 201]
    # Positions 11 and 12: block 3 is new, and the query at 11 sees 4 .. 11, so block 0
    # goes back.
    assert seq.num_computed_tokens == 11 and len(seq.block_tables[1]) == 3
    assert group.num_blocks_needed(seq, 2) == 0
    group.pool.take(seq.block_tables[1][0])  # as a sequence with the same tokens would
    assert group.num_blocks_needed(seq, 2) == 1


def free_blocks(bm: BlockManager) -> list[int]:
    return [group.pool.num_free_blocks for group in bm.groups]


def test_blocks_needed_are_what_a_chunk_takes_net_of_those_leaving() -> None:
    bm = manager()
    seq = make_seq("a", [10, 11, 12])
    compute(bm, seq, 3)
    for step, chunk in enumerate([1, 9, 2, 13, 1, 1, 6, 17, 4, 3, 11]):
        seq.token_ids += [100 + step] * chunk
        needed = [group.num_blocks_needed(seq, chunk) for group in bm.groups]
        free_before = free_blocks(bm)
        compute(bm, seq, chunk)
        taken = [max(0, a - b) for a, b in zip(free_before, free_blocks(bm), strict=True)]
        assert needed == taken, (step, chunk)


def test_next_turn_finds_the_window_before_its_prefix() -> None:
    bm = manager()
    turn1 = make_seq("t1", list(range(10, 47)))  # 37 tokens
    compute(bm, turn1, 37)
    for step in range(6):  # the answer, decoded
        turn1.token_ids.append(200 + step)
        compute(bm, turn1, 1)
    bm.free(turn1)  # 43 tokens computed: 10 full blocks registered
    turn2 = make_seq("t2", turn1.token_ids + [7, 8, 9, 10, 11])
    hit = bm.allocate_cached_prefix(turn2)
    assert hit == 40  # every full block of turn 1, in both groups
    assert len(turn2.block_table) == 10
    # The sliding group holds only what the first new query sees: positions 33 .. 40.
    table = turn2.block_tables[1]
    assert table[:8] == [NULL_BLOCK] * 8 and NULL_BLOCK not in table[8:]
    compute(bm, turn2, turn2.num_uncomputed_tokens)
    bm.free(turn2)
    assert sliding_used(bm) == 0


def test_a_hit_stops_where_the_sliding_blocks_were_evicted() -> None:
    bm = manager(num_sliding_blocks=12)  # 11 usable blocks: a 44-token prefill fills them
    first = make_seq("a", list(range(10, 54)))  # 44 tokens: 11 blocks
    compute(bm, first, 44)
    bm.free(first)
    other = make_seq("b", list(range(500, 516)))  # 4 fresh blocks evict a's oldest
    compute(bm, other, 16)
    again = make_seq("c", first.token_ids + [1])
    # a's global blocks are all cached, its sliding ones only up to block 6 (a freed
    # sequence's last blocks go first): the hit ends at block 7, whose window (blocks 5
    # and 6) is still cached.
    hit = bm.allocate_cached_prefix(again)
    assert hit == 28
    assert again.block_tables[1][:5] == [NULL_BLOCK] * 5
    assert len(resident(again.block_tables[1])) == 2
    bm.free(again)
    bm.free(other)
    # Evict every sliding block of a: only the global prefix is left, and it is unusable.
    filler = make_seq("d", list(range(700, 744)))
    compute(bm, filler, 44)
    again = make_seq("e", first.token_ids + [1])
    assert bm.allocate_cached_prefix(again) == 0
    assert again.block_table == [] and again.block_tables[1] == []


def test_usable_prefix_needs_the_window_before_it() -> None:
    group = manager().groups[1]
    cached = [None, None, 5, 6, 7, None, 9]
    # Computing on from block k needs blocks first_kept(4k) .. k-1.
    assert group.usable_prefix(cached) == 5  # blocks 3, 4 (k=5: positions 13 ..)
    assert group.usable_prefix([None, 1]) == 0  # k=2 needs block 0 as well
    assert group.usable_prefix([]) == 0


def test_fork_shares_and_copies_the_partial_sliding_block() -> None:
    bm = manager()
    parent = make_seq("p", list(range(10, 30)))  # 20 tokens
    compute(bm, parent, 20)
    child = make_seq("c", list(parent.token_ids))
    bm.fork(parent, child, 19)
    assert child.block_tables[1] == parent.block_tables[1]
    child_copies = bm.allocate_slots(child, 1)  # the last block is shared: copied
    moves = bm.take_later_group_moves()[0]
    assert len(child_copies) == 1 and len(moves.copy) == 1
    assert moves.copy[0][0] == parent.block_tables[1][4]
    assert child.block_tables[1][4] == moves.copy[0][1]
    bm.free(parent)
    bm.free(child)
    assert sliding_used(bm) == 0


def test_swap_moves_only_the_blocks_in_the_window() -> None:
    bm = manager(num_cpu_blocks=20)
    seq = make_seq("s", list(range(10, 50)))  # 40 tokens
    compute(bm, seq, 40)
    seq.token_ids.append(1)
    compute(bm, seq, 1)  # the blocks left of the window go
    kept = resident(seq.block_tables[1])
    assert bm.can_swap_out(seq)
    global_pairs = bm.swap_out(seq)
    moves = bm.take_later_group_moves()[0]
    assert len(global_pairs) == 11 and [gpu for gpu, _ in moves.swap_out] == kept
    assert sliding_used(bm) == 0
    assert seq.block_tables[1].count(NULL_BLOCK) == 11 - len(kept)
    seq.token_ids.append(2)
    assert bm.can_swap_in(seq, 1)
    bm.swap_in(seq)
    moves = bm.take_later_group_moves()[0]
    assert len(moves.swap_in) == len(kept)
    assert [gpu for _, gpu in moves.swap_in] == resident(seq.block_tables[1])
    assert len(bm.groups[1].pool.free_cpu_blocks) == 20  # every CPU block back
    bm.free(seq)
    assert sliding_used(bm) == 0


def test_a_swap_in_waits_for_the_windows_blocks_too() -> None:
    bm = manager(num_sliding_blocks=5, num_cpu_blocks=8)  # 4 blocks and the null one
    seq = make_seq("s", list(range(10)))
    compute(bm, seq, 10)
    bm.swap_out(seq)
    seq.token_ids.append(10)
    other = make_seq("o", list(range(100, 106)))
    compute(bm, other, 6)  # 2 of the window's 4 blocks left; seq needs 3 for position 10
    assert not bm.can_swap_in(seq, 1)  # though the first group has 62 free
    bm.free(other)
    assert bm.can_swap_in(seq, 1)


def left_behind(group, seq) -> list[int]:
    """Entries a step should have given back by now: every block left of the window but
    the window before the prompt's last full block (a whole scan of the table)."""
    kept = group.first_kept(seq.num_computed_tokens)
    prompt_blocks = (seq.num_prompt_tokens - 1) // BS
    aside = range(group.first_kept(prompt_blocks * BS), prompt_blocks)
    table = seq.block_tables[1]
    return [i for i in range(kept) if table[i] != NULL_BLOCK and i not in aside]


@pytest.mark.parametrize("seed", range(8))
def test_every_block_left_of_the_window_goes_back(seed: int) -> None:
    """Chunks of any size, prefix hits and n > 1's forks: the blocks that left the
    window are given back at the next step, however far back they are."""
    rng = random.Random(seed)
    bm = manager(num_sliding_blocks=200)
    group = bm.groups[1]
    finished: list[list[int]] = []
    for n in range(8):
        if finished and rng.random() < 0.5:  # a next turn: a prefix hit, then more
            prompt = rng.choice(finished) + [
                rng.randrange(1000) for _ in range(rng.randrange(1, 9))
            ]
        else:
            prompt = [rng.randrange(1000) for _ in range(rng.randrange(1, 40))]
        seq = make_seq(f"s{n}", prompt)
        bm.allocate_cached_prefix(seq)
        live = [seq]
        for _ in range(rng.randrange(1, 30)):
            for s in list(live):
                if s.num_uncomputed_tokens == 0:
                    s.token_ids.append(rng.randrange(1000))
                chunk = rng.randrange(1, s.num_uncomputed_tokens + 1)
                bm.allocate_slots(s, chunk)
                assert left_behind(group, s) == []
                s.num_computed_tokens += chunk
                bm.register_full_blocks(s)
                if s is seq and s.num_computed_tokens == s.num_tokens == s.num_prompt_tokens:
                    # n > 1, as the scheduler forks: the prompt's last token recomputed
                    for i in range(rng.randrange(3)):
                        child = make_seq(f"s{n}.{i}", prompt)
                        bm.fork(seq, child, seq.num_tokens - 1)
                        child.num_computed_tokens = seq.num_tokens - 1
                        live.append(child)
        finished.append(list(seq.token_ids[: seq.num_computed_tokens]))
        for s in live:
            bm.free(s)
    assert sliding_used(bm) == 0


@pytest.mark.parametrize("budget_blocks", [10, 100_000])
def test_pool_sizes_give_the_sliding_group_what_it_can_hold(budget_blocks: int) -> None:
    config = EngineConfig(model="x", block_size=16, max_num_seqs=4, max_num_batched_tokens=64)
    needed = windowed_blocks_needed(config, 512)
    assert needed == 1 + 4 * (2 * 32 + 2) + 4
    global_bytes, sliding_bytes = 3, 15  # Gemma 3 270M: 3 global layers, 15 sliding
    budget = budget_blocks * (global_bytes + sliding_bytes)
    num_blocks, num_sliding = pool_sizes(
        config, lambda: budget, (global_bytes, sliding_bytes), (None, 512)
    )
    assert num_blocks * global_bytes + num_sliding * sliding_bytes <= budget
    if budget_blocks == 10:  # too little to bound anything: both the same
        assert num_sliding == num_blocks + 1
    else:  # the sliding group gets what it can hold, the global one the rest
        assert num_sliding == needed
        assert num_blocks > 5 * budget_blocks - 5 * needed


def test_a_third_group_is_one_more_index() -> None:
    """Groups by index: a second windowed group beside the first (a kind of layer the
    models do not have yet) keeps its own window, swaps and frees with the others,
    and its copies reach the runner as its own."""
    bm = BlockManager(
        num_blocks=64,
        block_size=BS,
        num_cpu_blocks=40,
        later_groups=[(WINDOW, 32), (2 * WINDOW, 32)],
    )
    seq = make_seq("s", list(range(10, 50)))  # 40 tokens
    compute(bm, seq, 40)
    for step in range(12):
        seq.token_ids.append(100 + step)
        compute(bm, seq, 1)
    narrow, wide = (resident(seq.block_tables[g]) for g in (1, 2))
    assert len(seq.block_tables) == 3 and len(seq.block_table) == 13
    assert len(narrow) < len(wide) < 13  # each windowed group bounded by its own window
    bm.swap_out(seq)
    moved = [[gpu for gpu, _ in moves.swap_out] for moves in bm.take_later_group_moves()]
    assert moved == [narrow, wide]
    seq.token_ids.append(1)
    bm.swap_in(seq)
    swapped_in = [moves.swap_in for moves in bm.take_later_group_moves()]
    assert [len(pairs) for pairs in swapped_in] == [len(narrow), len(wide)]
    bm.free(seq)
    stats = bm.memory_stats()
    assert stats["used_blocks"] == stats["group1_used_blocks"] == stats["group2_used_blocks"] == 0


def test_a_shorter_prefix_needs_its_own_window_too() -> None:
    """can_take for fewer blocks than usable_prefix gave (a busy pool): the window
    before the shorter prefix may reach a block the cache lacks."""
    group = manager().groups[1]
    cached = [None, None, 5, 6, 7, None, 9]
    assert group.usable_prefix(cached) == 5
    assert group.can_take(cached, 5) and group.can_take(cached, 4)  # blocks 3-4, 2-3
    assert not group.can_take(cached, 3)  # blocks 1-2: block 1 is not cached


def test_a_prefix_fits_when_the_blocks_leaving_the_free_list_do() -> None:
    """A cached block a sequence holds costs no free block; a host-RAM hit takes one."""
    bm = BlockManager(num_blocks=64, block_size=BS, num_cpu_blocks=0)
    group = bm.groups[0]
    held = make_seq("held", list(range(4 * 50)))
    compute(bm, held, 4 * 50)
    free = group.pool.num_free_blocks
    assert 0 < free < 20
    found = [*held.block_table[:3], *["ram"] * free, "ram"]
    assert group.can_take(found, 3 + free)
    assert not group.can_take(found, 3 + free + 1)


def test_host_ram_hits_past_a_miss_count_only_with_a_window() -> None:
    """find_cached with the tiers: blocks 0 and 2 in host RAM, block 1 nowhere. Without
    a window nothing after the miss is usable, so the lookup stops there (and holds no
    slot for block 2); a windowed group may start past it, so it looks on."""
    tokens = list(range(100, 100 + 3 * BS))
    hashes = [7000, 7001, 7002]
    planner = TierPlanner(num_groups=2, num_slots=4, block_size=BS, disk=None)
    for group in (0, 1):
        for i in (0, 2):
            planner.save(group, i, hashes[i], tuple(tokens[i * BS : (i + 1) * BS]))
    bm = manager()
    found_global = bm.groups[0].find_cached(hashes, tokens, planner)
    found_sliding = bm.groups[1].find_cached(hashes, tokens, planner)
    assert [type(entry) for entry in found_global] == [TierHit, type(None)]
    assert [type(entry) for entry in found_sliding] == [TierHit, type(None), TierHit]
