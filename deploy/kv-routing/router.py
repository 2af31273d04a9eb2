"""An example router that sends each OpenAI request to the replica whose KV cache holds
the longest run of its prompt's leading blocks, known from nothing but the replicas' KV
events (vLLM's wire format). It shows that the events are enough; in production llm-d's
precise prefix-cache scorer or Dynamo's KV router do this job.

    PYTHONHASHSEED=0 python deploy/kv-routing/router.py --port 8000 \\
        --replica http://127.0.0.1:8001,tcp://127.0.0.1:5557,tcp://127.0.0.1:5558 \\
        --replica http://127.0.0.1:8002,tcp://127.0.0.1:5567,tcp://127.0.0.1:5568

Each replica runs with ``--prefix-caching-hash-algo sha256_cbor``, the same
PYTHONHASHSEED and ``--kv-events-config`` (see README.md beside this file).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import cbor2
import httpx
import msgspec
import uvicorn
import zmq
import zmq.asyncio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

END_SEQ = -1  # the replay's last frame


# The events as vLLM sends them: msgpack arrays, each event tagged with its class name
# (fields that older versions lack, last, with defaults).
class Event(msgspec.Struct, array_like=True, tag=True):
    pass


class BlockStored(Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class BlockRemoved(Event):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(Event):
    pass


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


DECODE = msgspec.msgpack.Decoder(KVEventBatch).decode


def sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def block_keys(token_ids: list[int], block_size: int, seed: str) -> list[int]:
    """The keys the events name a prompt's full blocks by: each block's hash chains its
    parent's (the first's parent: the seed's hash), and events carry its last 8 bytes."""
    parent, keys = sha256_cbor(seed), []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = sha256_cbor((parent, tuple(token_ids[start : start + block_size]), None))
        keys.append(int.from_bytes(parent[-8:], "big"))
    return keys


@dataclass
class Replica:
    url: str
    events: str  # its PUB socket
    replay: str | None  # its ROUTER socket for past batches
    blocks: set[int] = field(default_factory=set)
    in_flight: int = 0
    routed: int = 0
    next_seq: int = 0
    first_batch: bytes = b""  # batch 0's payload: a restarted replica sends another
    synced: asyncio.Event = field(default_factory=asyncio.Event)

    def apply(self, seq: int, payload: bytes) -> None:
        for event in DECODE(payload).events:
            if isinstance(event, AllBlocksCleared):
                self.blocks.clear()
            elif event.medium not in (None, "GPU") or event.group_idx not in (None, 0):
                continue  # host RAM's ("CPU") or a second KV group's: not the device's prefix
            elif isinstance(event, BlockStored):
                self.blocks.update(event.block_hashes)
            else:
                self.blocks.difference_update(event.block_hashes)
        if seq == 0:
            self.first_batch = payload
        self.next_seq = seq + 1

    def leading_blocks(self, keys: list[int]) -> int:
        """How many of ``keys``, from the first, this replica holds: only an unbroken
        run from the start is reusable, as a block's hash covers all before it."""
        count = 0
        for key in keys:
            if key not in self.blocks:
                break
            count += 1
        return count


async def replay(replica: Replica, context: zmq.asyncio.Context) -> None:
    """Every kept batch from ``replica.next_seq`` on, from the replica's replay socket."""
    if replica.replay is None:
        return
    sock = context.socket(zmq.DEALER)
    sock.connect(replica.replay)  # queued until the replica binds: it may still be loading
    try:
        await sock.send_multipart([b"", replica.next_seq.to_bytes(8, "big")])
        while True:
            _, seq_bytes, payload = await sock.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == END_SEQ:
                return
            if seq >= replica.next_seq:
                replica.apply(seq, payload)
    finally:
        sock.close(linger=0)


async def follow(replica: Replica, context: zmq.asyncio.Context, topic: bytes) -> None:
    """Subscribe first, so nothing falls between the replay and the live batches; then
    replay from sequence 0 and apply live batches, replaying again over any gap."""
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(replica.events)
    await replay(replica, context)
    replica.synced.set()
    while True:
        _, seq_bytes, payload = await sub.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        if seq == 0 and payload != replica.first_batch:
            replica.next_seq = 0  # the replica restarted: its numbers begin again
        if seq < replica.next_seq:
            continue  # the replay brought it already
        if seq > replica.next_seq:
            await replay(replica, context)  # batches were lost (e.g. a slow subscription)
            if seq < replica.next_seq:
                continue
        replica.apply(seq, payload)


class Router:
    def __init__(
        self, replicas: list[Replica], policy: str, tokenizer: Any, block_size: int, seed: str
    ) -> None:
        self.replicas, self.policy, self.tokenizer = replicas, policy, tokenizer
        self.block_size, self.seed = block_size, seed
        self.turn = itertools.count()  # round-robin, and ties among the least loaded

    def prompt_tokens(self, body: dict[str, Any]) -> list[int]:
        """The prompt's tokens as the server builds them: the same tokenizer, and for a
        chat the same template with its generation prompt."""
        if "messages" in body:
            messages = [{**m, "content": text_of(m.get("content"))} for m in body["messages"]]
            return self.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=body.get("add_generation_prompt", True),
                tokenize=True,
                return_dict=True,
                **(body.get("chat_template_kwargs") or {}),
            )["input_ids"]
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        return []  # a batch of prompts has no one prefix to follow

    def keys(self, body: dict[str, Any]) -> list[int]:
        try:
            return block_keys(self.prompt_tokens(body), self.block_size, self.seed)
        except Exception:  # a malformed request: a replica answers it with its error
            return []

    def pick(self, body: dict[str, Any]) -> tuple[Replica, int, int]:
        """The replica for a request, with its prompt's full blocks held there and in all."""
        if self.policy == "round-robin":
            return self.replicas[next(self.turn) % len(self.replicas)], 0, 0
        keys = self.keys(body)
        held = [r.leading_blocks(keys) for r in self.replicas]
        best = max(held)
        # The replicas holding the most; where none holds any, all of them. Among those
        # the least loaded, ties taken in turn.
        candidates = [r for r, n in zip(self.replicas, held, strict=True) if n == best]
        least = min(r.in_flight for r in candidates)
        candidates = [r for r in candidates if r.in_flight == least]
        return candidates[next(self.turn) % len(candidates)], best, len(keys)


def text_of(content: Any) -> Any:
    """A message's text parts joined, as the server gives templates a message's text."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return content


def build_app(router: Router, topic: bytes) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        context = zmq.asyncio.Context()
        tasks = [asyncio.create_task(follow(r, context, topic)) for r in router.replicas]
        for task in tasks:  # a subscriber that fails says so, rather than go quiet
            task.add_done_callback(lambda t: t.cancelled() or t.result())
        app.state.client = httpx.AsyncClient(timeout=None)
        yield
        for task in tasks:
            task.cancel()
        await app.state.client.aclose()
        context.destroy(linger=0)

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        """200 once every replica's past events are replayed."""
        ready = all(r.synced.is_set() for r in router.replicas)
        return Response(status_code=200 if ready else 503)

    @app.get("/router/state")
    async def state() -> list[dict[str, Any]]:
        fields = ("url", "in_flight", "routed", "next_seq")
        return [
            {f: getattr(r, f) for f in fields} | {"blocks": len(r.blocks)} for r in router.replicas
        ]

    @app.post("/router/match")
    async def match(request: Request) -> dict[str, Any]:
        """Where a request's prompt is cached, without sending it: its full blocks, and
        how many of them, from the first, each replica holds (policy events only)."""
        keys = router.keys(msgspec.json.decode(await request.body()))
        return {
            "blocks": len(keys),
            "held": {r.url: r.leading_blocks(keys) for r in router.replicas},
        }

    @app.post("/v1/completions")
    @app.post("/v1/chat/completions")
    async def route(request: Request) -> Response:
        raw = await request.body()
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return JSONResponse({"error": {"message": "the body is not JSON"}}, 400)
        replica, matched, total = router.pick(body)
        headers = {"content-type": "application/json"}
        if "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        upstream_request = app.state.client.build_request(
            "POST", replica.url + request.url.path, content=raw, headers=headers
        )
        replica.in_flight += 1
        replica.routed += 1
        try:
            upstream = await app.state.client.send(upstream_request, stream=True)
        except httpx.TransportError as exc:
            replica.in_flight -= 1
            return JSONResponse({"error": {"message": f"{replica.url}: {exc!r}"}}, 502)

        async def passthrough() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():  # streams stay streams
                    yield chunk
            finally:
                await upstream.aclose()
                replica.in_flight -= 1

        return StreamingResponse(
            passthrough(),
            upstream.status_code,
            headers={"x-replica": replica.url, "x-prefix-blocks": f"{matched}/{total}"},
            media_type=upstream.headers.get("content-type"),
        )

    return app


def load_tokenizer(name: str | None) -> Any:
    from transformers import AutoTokenizer

    if name is None:  # the server's embedded SmolLM2: the tokenizer its GGUF file carries
        from hetero_infer.engine.loader.gguf_metadata import gguf_metadata_folder
        from hetero_infer.engine.loader.source import resolve_model

        name = str(gguf_metadata_folder(resolve_model(None)))
    return AutoTokenizer.from_pretrained(name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--replica",
        action="append",
        required=True,
        help="URL,EVENTS[,REPLAY]: a replica's HTTP address, its events' PUB socket and "
        "its replay socket, e.g. http://127.0.0.1:8001,tcp://127.0.0.1:5557,tcp://127.0.0.1:5558",
    )
    parser.add_argument("--policy", choices=("events", "round-robin"), default="events")
    parser.add_argument("--tokenizer", help="the model's tokenizer (default: the embedded one)")
    parser.add_argument("--block-size", type=int, default=16, help="the replicas' block_size")
    parser.add_argument("--hash-seed", default=os.environ.get("PYTHONHASHSEED", "0"))
    parser.add_argument("--topic", default="kv")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    replicas = []
    for text in args.replica:
        url, events, *rest = text.split(",")
        replicas.append(Replica(url.rstrip("/"), events, rest[0] if rest else None))
    tokenizer = load_tokenizer(args.tokenizer) if args.policy == "events" else None
    router = Router(replicas, args.policy, tokenizer, args.block_size, args.hash_seed)
    uvicorn.run(build_app(router, args.topic.encode()), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
