"""AsyncEngine: the LLMEngine stepped by its own thread, one asyncio queue per request.

The engine's state is touched by one thread only, the engine thread: it takes the
requests to add or abort (handed over under a lock) between steps, runs the steps
back to back while there is work, and hands each step's outputs to the event loop in
one call, which puts them in the requests' queues. So the event loop serves HTTP
while the model computes, and the engine never waits for it (a step started by the
loop waited for it to write the last step's chunks: 7% of the time at 16 streams).

It is also the server's one view of the engine (vLLM's EngineClient): the tokenizer,
the input processor, generate and abort, LoRA adapters, what /metrics reads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from hetero_infer.engine.entrypoints.engine_thread import NewRequest, engine_thread, settle
from hetero_infer.engine.entrypoints.llm_engine import LLMEngine
from hetero_infer.engine.entrypoints.metrics import EngineMetrics
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.frontend.input_processor import EngineRequest, InputProcessor
from hetero_infer.engine.lora import LoRAManager
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.params.generation_defaults import GenerationDefaults
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import ExecutionError, SchedulerError
from hetero_infer.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
T = TypeVar("T")

# How often an idle engine with tensor-parallel ranks checks that they are alive, so a
# dead rank shows in /healthz without waiting for a request.
HEALTH_CHECK_INTERVAL = 1.0


class EngineDeadError(ExecutionError):
    """The engine loop has stopped on an error; no request can be served."""


class AsyncEngine:
    def __init__(
        self,
        engine: LLMEngine,
        max_pending: int | None = None,
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        """``max_pending``: requests accepted and not finished, beyond which new ones
        are refused with SchedulerError (None: no limit). ``executor``: the one thread
        that runs the steps (``load`` passes the one that built the engine)."""
        self._engine = engine
        self.max_pending = max_pending
        # The requests' queues: the event loop's only.
        self._queues: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        # Handed to the engine thread under the lock: requests to add, ids to abort,
        # work to run between steps (``call``).
        self._lock = threading.Lock()
        self._new: list[NewRequest] = []
        self._aborts: set[str] = set()
        self._calls: list[tuple[Callable[[LLMEngine], Any], asyncio.Future]] = []
        self._work = threading.Event()  # set when there is something to take
        self._stopping = False
        self._executor = executor or engine_thread()
        self._task: asyncio.Task | None = None
        self.dead_error: BaseException | None = None
        # Requests refused with SchedulerError, by reason: "queue_full" (max_pending),
        # "queue_time" (the engine's max_queue_time).
        self.rejections: Counter[str] = Counter(queue_full=0, queue_time=0)

    @classmethod
    async def load(cls, config: EngineConfig, max_pending: int | None = None) -> AsyncEngine:
        """An LLMEngine built in the thread that will run its steps. OpenMP keeps a
        pool of workers per thread that starts parallel work; with a second pool alive
        libgomp stops its workers spinning between regions, and a batch-1 decode step
        took 9.4 ms instead of 3.9 (SmolLM2, 2 cores). So one thread does all the
        engine's parallel work: loading, LoRA adapters (``call``) and steps."""
        executor = engine_thread()
        engine = await asyncio.get_running_loop().run_in_executor(executor, LLMEngine, config)
        return cls(engine, max_pending, executor)

    # ---- lifecycle ----

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        """The engine thread leaves after the step it is in, if any."""
        if self._task is not None:
            self._stopping = True
            self._work.set()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._executor.shutdown(wait=True)
        self._engine.shutdown()

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done() and self.dead_error is None

    @property
    def num_pending(self) -> int:
        """Requests accepted and not finished."""
        return len(self._queues)

    # ---- what the server reads ----

    @property
    def tokenizer(self) -> Tokenizer:
        return self._engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    @property
    def block_size(self) -> int:  # tokens per KV block (and so per prefix-cache entry)
        return self._engine.config.block_size

    @property
    def model_config(self) -> ModelConfig:
        return self._engine.model_config

    @property
    def input_processor(self) -> InputProcessor:
        """Checks and tokenizes a request into the EngineRequest that generate() takes."""
        return self._engine.input_processor

    @property
    def generation_defaults(self) -> GenerationDefaults:
        """The sampling values for the fields a request leaves out (generation_config)."""
        return self._engine.generation_defaults

    @property
    def metrics(self) -> EngineMetrics:
        return self._engine.metrics

    def memory_stats(self) -> dict[str, Any]:
        return self._engine.memory_stats()

    # ---- requests ----

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs as the engine makes them, until all are finished.

        The request comes checked from ``input_processor``; the loop queues it as it
        is. With n > 1 the outputs of the n choices interleave (``output.index`` says
        which); the iteration ends after the last choice's finished output.
        SchedulerError for a full queue, or for a request that waited longer than
        max_queue_time to start (or ValidationError for a request id in use), is raised
        before the first output. Leaving the iteration early (a client that went away)
        aborts the request.
        """
        if self.dead_error is not None:
            raise EngineDeadError("the engine loop has stopped") from self.dead_error
        if self.max_pending is not None and len(self._queues) >= self.max_pending:
            self.rejections["queue_full"] += 1
            raise SchedulerError(
                f"the server has {self.max_pending} requests in hand, its limit "
                "(max_waiting_requests); retry later"
            )
        request_id = request.request_id
        new = NewRequest(request)
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._queues[request_id] = queue
        with self._lock:
            self._new.append(new)
        self._work.set()
        finished = False
        num_finished = 0
        try:
            await new.accepted
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finish_reason == "rejected":
                    self.rejections["queue_time"] += 1
                    raise SchedulerError(
                        f"the request waited longer than max_queue_time "
                        f"({self._engine.config.max_queue_time:g} s) to start; retry later"
                    )
                num_finished += item.finished
                finished = num_finished == request.params.n
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    async def call(self, work: Callable[[LLMEngine], T]) -> T:
        """``work(engine)`` on the engine thread, between steps (LoRA adapters loaded
        and unloaded); its result, or what it raised."""
        if self.dead_error is not None:
            raise EngineDeadError("the engine loop has stopped") from self.dead_error
        loop = asyncio.get_running_loop()
        if self._task is None:  # no loop yet: the engine thread is free
            return await loop.run_in_executor(self._executor, work, self._engine)
        done = loop.create_future()
        with self._lock:
            self._calls.append((work, done))
        self._work.set()
        return await done

    @property
    def lora(self) -> LoRAManager | None:  # None unless enable_lora; changed by ``call``
        return self._engine.lora

    def lora_requests_info(self) -> tuple[list[str], list[str]]:
        return self._engine.adapters.requests_info()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.add(request_id)
        self._work.set()

    def end_all(self, error: BaseException) -> None:
        """Every request in hand ends, its generate() raising ``error`` (at shutdown)."""
        for queue in self._queues.values():
            queue.put_nowait(error)

    # ---- the loop ----

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._serve, loop)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug or a device error: fail loudly, not silently
            logger.exception("engine loop died")
            self.dead_error = exc
            error = EngineDeadError(f"the engine loop has stopped: {exc}")
            with self._lock:
                new, self._new = self._new, []
                calls, self._calls = self._calls, []
            for future in [item.accepted for item in new] + [done for _, done in calls]:
                settle(future, error)
            self.end_all(error)

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """The engine thread: take requests, step while there is work, hand the outputs
        over; wait when there is none (checking tensor-parallel ranks meanwhile, so that
        a dead one shows in /healthz without a request)."""
        engine = self._engine
        idle_timeout = HEALTH_CHECK_INTERVAL if engine.workers is not None else None
        while not self._stopping:
            self._work.clear()  # before taking: a request handed over later wakes the wait
            self._take_requests(loop)
            engine.check_health()
            if not engine.has_pending_work():
                self._work.wait(idle_timeout)
                continue
            outputs = engine.step()
            if outputs:
                loop.call_soon_threadsafe(self._dispatch, outputs)

    def _take_requests(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the engine thread: add the new requests, then apply the aborts (a client
        that left before its request was taken aborts it right after)."""
        with self._lock:
            new, self._new = self._new, []
            aborts, self._aborts = self._aborts, set()
            calls, self._calls = self._calls, []
        if calls:  # they may use the model runner: not while it computes a step
            self._engine.core.wait_for_runner()
        for work, done in calls:
            try:
                result = work(self._engine)
            except Exception as exc:  # the caller's to answer (a bad adapter: a 400)
                loop.call_soon_threadsafe(settle, done, exc)
            else:
                loop.call_soon_threadsafe(settle, done, None, result)
        for item in new:
            try:
                self._engine.add_processed(item.request)
            except ValueError as exc:
                loop.call_soon_threadsafe(settle, item.accepted, exc)
            else:
                loop.call_soon_threadsafe(settle, item.accepted, None)
        for request_id in aborts:
            self._engine.abort(request_id)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        """On the event loop: a step's outputs into their requests' queues."""
        for output in outputs:
            queue = self._queues.get(output.group_id)
            if queue is not None:
                queue.put_nowait(output)
