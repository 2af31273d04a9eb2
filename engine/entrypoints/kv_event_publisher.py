"""The prefix cache's events published as vLLM publishes them (``--kv-events-config``),
for llm-d's precise prefix-cache scorer and Dynamo's KV router to subscribe to.

The settings are vLLM's KVEventsConfig, as JSON: ``enable_kv_cache_events``,
``publisher`` ("zmq", or "null" for none), ``endpoint`` (the PUB socket, bound where
it has a wildcard, else connected; default ``tcp://*:5557``), ``replay_endpoint`` (a ROUTER
socket that replays past batches; none by default), ``buffer_steps`` (batches kept for
replay), ``hwm`` (the PUB socket's high-water mark) and ``topic``.

The wire format is vLLM's: each step's events in one ``KVEventBatch`` (ts, events),
msgpack-encoded with msgspec as array-like structs, each event tagged with its class
name; sent as three frames (topic, the batch's sequence number as 8 bytes big-endian,
the payload), numbered from 0 without gaps. A replay request is one frame of 8 bytes,
the first sequence number wanted; the reply is each kept batch from there as (sequence
number, payload), then the end marker (-1, empty payload).

Sockets belong to one thread: the engine's steps put their batches on a queue and a
thread of the publisher's sends them and answers replays, so a step never waits on
the network.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq
from hetero_infer.engine.core import kv_events
from hetero_infer.engine.settings.exceptions import ConfigError

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


# vLLM's structs (vllm/distributed/kv_events.py), as msgpack carries them.
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


# Later fields came with later vLLM versions, each at the end: a subscriber written for
# fewer reads what it knows (msgspec ignores an array-like struct's extra fields).
class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        try:
            values = json.loads(text)
            config = cls(**values)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ConfigError(f"kv_events_config: {exc}") from exc
        if config.publisher not in ("zmq", "null"):
            raise ConfigError(f"kv_events_config: publisher {config.publisher!r}: zmq or null")
        return config

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


def wire_event(event: kv_events.KVEvent) -> KVCacheEvent:
    """Our event as vLLM's struct."""
    if isinstance(event, kv_events.AllBlocksCleared):
        return AllBlocksCleared()
    if isinstance(event, kv_events.BlockRemoved):
        return BlockRemoved(event.block_hashes, event.medium, group_idx=event.group)
    return BlockStored(
        event.block_hashes,
        event.parent_block_hash,
        event.token_ids,
        event.block_size,
        event.lora_id,
        event.medium,
        event.lora_name,
        group_idx=event.group,
    )


class ZmqEventPublisher:
    def __init__(self, config: KVEventsConfig) -> None:
        self.config = config
        self._queue: queue.Queue[list[kv_events.KVEvent] | None] = queue.Queue(
            config.max_queue_size
        )
        self._encoder = msgspec.msgpack.Encoder()
        self._context = zmq.Context()
        self._pub = self._socket(zmq.PUB, config.endpoint, config.hwm)
        self._replay = None
        if config.replay_endpoint is not None:
            self._replay = self._socket(zmq.ROUTER, config.replay_endpoint)
        self._kept: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._next_seq = 0
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def _socket(self, kind: int, endpoint: str, hwm: int | None = None) -> zmq.Socket:
        sock = self._context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if hwm is not None:  # before bind or connect, which take the socket's options
            sock.set_hwm(hwm)
        # vLLM's rule: an address with a wildcard, or a local transport, is bound
        if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
        return sock

    def publish(self, events: list[kv_events.KVEvent]) -> None:
        """A step's events (the KVEventLog's sink). A full queue drops the batch, saying
        so: a step never waits for the subscribers."""
        try:
            self._queue.put_nowait(events)
        except queue.Full:
            logger.warning("kv events: the queue is full; a step's events are dropped")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=2.0)
        self._context.destroy(linger=0)

    def _run(self) -> None:
        poller = zmq.Poller()
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        topic = self.config.topic.encode()
        while True:
            if self._replay is not None and poller.poll(timeout=0):
                self._answer_replay()
            try:
                events = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if events is None:
                return
            batch = KVEventBatch(ts=time.time(), events=[wire_event(e) for e in events])
            payload = self._encoder.encode(batch)
            seq = self._next_seq.to_bytes(8, "big", signed=True)
            self._kept.append((self._next_seq, payload))
            self._next_seq += 1
            self._pub.send_multipart((topic, seq, payload))

    def _answer_replay(self) -> None:
        frames = self._replay.recv_multipart()
        client, start = frames[0], int.from_bytes(frames[-1], "big", signed=True)
        for seq, payload in list(self._kept):
            if seq >= start:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))


def event_publisher(text: str | None) -> ZmqEventPublisher | None:
    """The publisher ``kv_events_config`` asks for, or None (events off: none recorded)."""
    if text is None:
        return None
    config = KVEventsConfig.from_json(text)
    return ZmqEventPublisher(config) if config.publishes else None
