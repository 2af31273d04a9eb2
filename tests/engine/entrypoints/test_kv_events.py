"""The prefix cache's events over ZeroMQ (``kv_events_config``), read by a subscriber
written from vLLM's wire format (its own msgspec structs, pyzmq): a 2,000-token prompt's
every full block stored, with its tokens, its parent and the block size, the hashes
those a router computes (sha256_cbor with PYTHONHASHSEED=0); blocks evicted removed;
AllBlocksCleared first; sequence numbers without gaps; a late subscriber's replay from a
sequence number, ending with the end marker; a reset publishing AllBlocksCleared. Events off:
no publisher, nothing recorded.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import zmq
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.engine.core.test_sha256_cbor_hashes import vllm_block_hashes
from tests.ports import free_port
from tests.tiny_models import TINY_MODELS, save_tiny_model

BLOCK_SIZE = 16
END_SEQ = (-1).to_bytes(8, "big", signed=True)


# vLLM's wire format (vllm/distributed/kv_events.py), written out here.
class Event(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class BlockStored(Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class BlockRemoved(Event):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(Event):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def router_hashes(token_ids: list[int]) -> list[int]:
    """A router's 64-bit keys of the full blocks: sha256_cbor's last 8 bytes."""
    return [int.from_bytes(h[-8:], "big") for h in vllm_block_hashes(token_ids, "0", BLOCK_SIZE)]


def receive(sub: zmq.Socket, quiet: float = 1.0) -> list[tuple[int, bytes]]:
    """(sequence number, payload) of each batch until none comes for ``quiet`` s."""
    batches = []
    while sub.poll(int(quiet * 1000)):
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"kv"
        batches.append((int.from_bytes(seq, "big", signed=True), payload))
    return batches


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"), max_position_embeddings=4096)


@dataclass
class Subscribed:
    engine: LLMEngine
    sub: zmq.Socket
    context: zmq.Context
    replay_port: int


@contextlib.contextmanager
def subscribed(folder, **config: Any) -> Iterator[Subscribed]:
    """An engine publishing its events (sha256_cbor, PYTHONHASHSEED set by the test) with
    a cache of 140 blocks, where a 2,000-token prompt's second evicts, and a subscriber."""
    port, replay_port = free_port(), free_port()
    settings = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": "kv",
    }
    engine = LLMEngine(
        EngineConfig(
            model=str(folder),
            block_size=BLOCK_SIZE,
            max_model_len=2048,
            max_num_blocks=140,
            prefix_caching_hash_algo="sha256_cbor",
            kv_events_config=json.dumps(settings),
            **config,
        )
    )
    context = zmq.Context()
    try:
        sub = context.socket(zmq.SUB)
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        time.sleep(0.5)  # the subscription reaches the publisher
        yield Subscribed(engine, sub, context, replay_port)
    finally:
        engine.shutdown()
        context.destroy(linger=0)


def random_prompts(seed: int, count: int) -> list[list[int]]:
    vocab = TINY_MODELS["llama"]().vocab_size
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(2000)] for _ in range(count)]


def test_a_subscriber_sees_every_block_stored_and_removed(folder, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    # in chunks: later events have parents
    with subscribed(folder, max_num_batched_tokens=512) as run:
        engine, sub, context = run.engine, run.sub, run.context
        prompts = random_prompts(0, 2)
        params = SamplingParams(max_tokens=4, temperature=0.0)
        outputs = [engine.generate([p], params, use_tqdm=False)[0] for p in prompts]
        batches = receive(sub)
        seqs = [seq for seq, _ in batches]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # no gaps
        events = [event for _, payload in batches for event in DECODER.decode(payload).events]
        assert isinstance(events[0], AllBlocksCleared)
        stored = [e for e in events if isinstance(e, BlockStored)]
        removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
        assert all(e.block_size == BLOCK_SIZE and e.medium == "GPU" for e in stored)
        assert all(e.group_idx == 0 and e.lora_name is None for e in stored)
        for prompt, out in zip(prompts, outputs, strict=True):
            # every full block whose KV was computed: the last token's never is
            computed = (prompt + out.token_ids)[:-1]
            expected = router_hashes(computed)
            mine = [e for e in stored if set(e.block_hashes) <= set(expected)]
            assert [h for e in mine for h in e.block_hashes] == expected
            assert [t for e in mine for t in e.token_ids] == computed[: len(expected) * BLOCK_SIZE]
            chain = [None, *expected]
            assert len(mine) >= 4  # a chunk's blocks at a time
            for e in mine:  # each event's parent: the block before its first
                assert e.parent_block_hash == chain[expected.index(e.block_hashes[0])]
        # the second prompt's blocks pushed out some of the first's: those, each once,
        # and the cache holds none of them now
        first = router_hashes((prompts[0] + outputs[0].token_ids)[:-1])
        assert removed and len(set(removed)) == len(removed) and set(removed) <= set(first)
        held = {h & (2**64 - 1) for h in engine.core.scheduler.block_manager.cached_blocks}
        assert not held & set(removed) and set(first) - set(removed) <= held

        # A subscriber that joins late asks for every batch from the first.
        replay = context.socket(zmq.DEALER)
        replay.connect(f"tcp://127.0.0.1:{run.replay_port}")
        replay.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed: list[tuple[bytes, Any]] = []
        while replay.poll(2000):
            _, seq, payload = replay.recv_multipart()
            replayed.append((seq, payload))
            if seq == END_SEQ:
                break
        assert replayed[-1] == (END_SEQ, b"")
        assert [(int.from_bytes(s, "big"), p) for s, p in replayed[:-1]] == batches


def test_no_events_without_the_setting(folder):
    engine = LLMEngine(EngineConfig(model=str(folder), max_model_len=256))
    assert engine.kv_events is None and engine.core.scheduler.block_manager.events is None
    off = json.dumps({"enable_kv_cache_events": False, "publisher": "zmq"})
    engine = LLMEngine(EngineConfig(model=str(folder), max_model_len=256, kv_events_config=off))
    assert engine.kv_events is None


def test_the_events_keep_a_routers_view_equal_to_each_tier(folder, monkeypatch):
    """Blocks evicted to host RAM are announced there ("CPU"), and brought back into the
    device cache by a later hit, announced again ("GPU"): a router that replays the
    events holds exactly what each tier holds."""
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    # 0.001 GiB of host RAM: 233 blocks here, which evict too
    with subscribed(folder, kv_offloading_size=0.001) as run:
        engine, sub = run.engine, run.sub
        block_manager = engine.core.scheduler.block_manager
        in_ram = block_manager.tiers.indexes[0].entries
        held: dict[str | None, set[int]] = {"GPU": set(), "CPU": set()}
        removed: dict[str | None, set[int]] = {"GPU": set(), "CPU": set()}
        stored_again = 0

        def replay_and_compare() -> None:
            """Replay the events published since the last call; each tier's view equals it."""
            nonlocal stored_again
            for _, payload in receive(sub):
                for event in DECODER.decode(payload).events:
                    if isinstance(event, BlockStored):
                        if event.medium == "GPU":
                            stored_again += len(removed["GPU"] & set(event.block_hashes))
                        held[event.medium] |= set(event.block_hashes)
                    elif isinstance(event, BlockRemoved):
                        held[event.medium] -= set(event.block_hashes)
                        removed[event.medium] |= set(event.block_hashes)
            assert held["GPU"] == {h & (2**64 - 1) for h in block_manager.cached_blocks}
            assert held["CPU"] == {h & (2**64 - 1) for h in in_ram}

        first, second, third = random_prompts(1, 3)
        params = SamplingParams(max_tokens=4, temperature=0.0)
        for prompt in (first, second, first):
            engine.generate([prompt], params, use_tqdm=False)
        replay_and_compare()  # (before the next prompt evicts them again)
        assert stored_again > 0  # the last run's blocks from host RAM
        engine.generate([third], params, use_tqdm=False)
        replay_and_compare()
        assert removed["CPU"]  # host RAM was full and let some go

        # A reset empties both tiers and says so at once, between steps.
        assert engine.core.reset_prefix_cache()
        events = [e for _, payload in receive(sub) for e in DECODER.decode(payload).events]
        assert [type(e) for e in events] == [AllBlocksCleared]
        assert not block_manager.cached_blocks and not in_ram


def test_the_disk_tiers_files_are_announced_as_written_and_removed(folder, monkeypatch, tmp_path):
    """Every block the disk tier writes is stored ("DISK") and every file its cap makes
    it remove is removed: a router's view equals the files in the directory."""
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    tiers = dict(kv_offloading_size=0.001, kv_offloading_dir=str(tmp_path))
    # 0.0005 GiB of files: about 110, fewer than written
    with subscribed(folder, **tiers, kv_offloading_dir_size=0.0005) as run:
        engine, sub = run.engine, run.sub
        params = SamplingParams(max_tokens=4, temperature=0.0)
        for prompt in random_prompts(2, 3):
            engine.generate([prompt], params, use_tqdm=False)
        assert engine.runner.kv_cache.tiers.writer.drain(30.0)
        engine.core.step()  # a step hands on what the writer did since the last
        on_disk: set[int] = set()
        removed = 0
        for _, payload in receive(sub):
            for event in DECODER.decode(payload).events:
                if isinstance(event, BlockStored) and event.medium == "DISK":
                    assert event.parent_block_hash is None and len(event.token_ids) == 16
                    on_disk |= set(event.block_hashes)
                elif isinstance(event, BlockRemoved) and event.medium == "DISK":
                    on_disk -= set(event.block_hashes)
                    removed += len(event.block_hashes)
        files = engine.runner.kv_cache.tiers.layout.group_folder(0).glob("*.kv")
        assert removed > 0  # the cap made it remove files
        assert on_disk == {int(path.stem, 16) & (2**64 - 1) for path in files}
