"""The block manager's KV events, read off its event log: a LoRA request's blocks name
their adapter, removals from different tiers stay apart, a run of blocks stored at once
is one event, and a reset empties the cache and is announced."""

from __future__ import annotations

from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.kv_events import (
    MEDIUM_HOST,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventLog,
    external_hash,
)
from hetero_infer.engine.lora import LoRARequest

from tests.engine.core.test_block_manager import BLOCK_SIZE, make_seq, prefill


def logged_manager() -> tuple[BlockManager, list[list]]:
    batches: list[list] = []
    log = KVEventLog(batches.append, BLOCK_SIZE)
    return BlockManager(num_blocks=8, block_size=BLOCK_SIZE, events=log), batches


def test_a_lora_requests_blocks_name_their_adapter():
    bm, batches = logged_manager()
    plain = make_seq("plain", list(range(9)))
    adapted = make_seq("adapted", list(range(9)))
    adapted.lora = LoRARequest("sql", 3, 2**40, "p")
    for seq in (plain, adapted):
        prefill(bm, seq)
    bm.events.end_step()
    cleared, *stored = batches[0]
    assert isinstance(cleared, AllBlocksCleared)
    assert [(e.lora_id, e.lora_name) for e in stored] == [(None, None), (3, "sql")]
    assert all(isinstance(e, BlockStored) and len(e.block_hashes) == 2 for e in stored)


def test_sequences_take_the_adapter_from_its_request():
    seq = make_seq("a", [1, 2, 3])
    assert (seq.lora_slot, seq.lora_name, seq.lora_fingerprint) == (0, None, None)
    seq.__init__("a", [1, 2, 3], seq.sampling_params, lora=LoRARequest("sql", 3, 2**40, "p"))
    assert (seq.lora_slot, seq.lora_name, seq.lora_fingerprint) == (3, "sql", 2**40)


def test_removals_from_each_tier_are_told_apart():
    log = KVEventLog(lambda events: None, BLOCK_SIZE)
    for block_hash in (1, 2):
        log.removed(0, block_hash)
    log.removed(0, 3, medium=MEDIUM_HOST)
    log.removed(1, 4, medium=MEDIUM_HOST)
    assert log.events == [
        AllBlocksCleared(),
        BlockRemoved([1, 2], "GPU", 0),
        BlockRemoved([3], "CPU", 0),
        BlockRemoved([4], "CPU", 1),
    ]
    assert external_hash(2**200 + 5) == 5


def test_a_reset_clears_the_cache_and_says_so():
    bm, batches = logged_manager()
    running = make_seq("running", list(range(9)))
    prefill(bm, running)
    assert not bm.reset_prefix_cache()  # its blocks hold KV in use: nothing changes
    assert len(bm.cached_blocks) == 2
    bm.free(running)
    assert bm.reset_prefix_cache()
    assert not bm.cached_blocks and bm.num_free_blocks == 8
    assert isinstance(bm.events.events[-1], AllBlocksCleared)
    again = make_seq("again", list(range(9)))
    assert bm.allocate_cached_prefix(again) == 0  # nothing left to find


def test_a_block_is_announced_once_however_many_sequences_share_it():
    """A prefix hit and a fork register the blocks they share again: only blocks not yet
    findable are stored events (a router counts each once)."""
    bm, batches = logged_manager()
    first = make_seq("first", list(range(9)))  # 2 full blocks
    prefill(bm, first)
    again = make_seq("again", list(range(9)) + [50, 51, 52])  # a hit on both, a third
    bm.allocate_cached_prefix(again)
    prefill(bm, again)
    child = make_seq("child", list(range(9)))
    bm.fork(first, child, first.num_tokens - 1)
    child.num_computed_tokens = first.num_tokens - 1
    prefill(bm, child)
    bm.events.end_step()
    stored = [h for e in batches[0] if isinstance(e, BlockStored) for h in e.block_hashes]
    assert len(stored) == len(set(stored)) == 3


def test_one_event_for_each_run_of_consecutive_blocks():
    """Blocks 1-3 and 5 of a chain stored at once (blocks 0 and 4 were cached already):
    two events, each naming the block before it as its parent."""
    log = KVEventLog(lambda events: None, BLOCK_SIZE)
    log.events.clear()
    chain = [10, 11, 12, 13, 14, 15]
    tokens = [tuple(range(i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE)) for i in range(6)]
    registered = [(100 + i, chain[i], tokens[i]) for i in (1, 2, 3, 5)]
    log.stored(0, chain, registered, make_seq("a", [1]))
    assert [(e.block_hashes, e.parent_block_hash) for e in log.events] == [
        ([11, 12, 13], 10),
        ([15], 14),
    ]
    assert log.events[0].token_ids == [t for block in tokens[1:4] for t in block]
