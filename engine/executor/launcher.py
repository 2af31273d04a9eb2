"""Rank 0's side of starting the group: the other ranks of its node as local
processes (or joining the ranks torchrun started), waiting for those of the other
nodes, and watching that its own stay alive.

A local rank is a fresh Python process running engine/executor/rank_worker.py. It is
given its rank, the group's size and the rendezvous port on its command line and the
engine's settings as JSON on its standard input: no pickled object crosses. On one
node the rendezvous and gloo's connections listen on loopback only; over several
(``nnodes``), on the address node 0 was given and the interface that reaches it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence

import torch
from hetero_infer.engine.distributed.process_group import (
    RENDEZVOUS_TIMEOUT,
    TensorParallelGroup,
    connect_store,
    listen_on,
)
from hetero_infer.engine.distributed.rendezvous import Rendezvous, node_ranks
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import ExecutionError
from hetero_infer.engine.setup import EngineSetup
from torch._C._distributed_c10d import Store

logger = logging.getLogger(__name__)

# How often a watch thread looks at the workers (on CUDA, see LocalWorkers.watch).
WATCH_INTERVAL = 0.5


def joined_key(rank: int) -> str:
    """The store key a worker sets once it is up, before it joins the groups."""
    return f"hetero_infer/joined/{rank}"


def start_tensor_parallel(setup: EngineSetup) -> tuple[TensorParallelGroup, LocalWorkers | None]:
    """Rank 0's group, the other ranks started here ("mp") or by torchrun
    ("external_launcher"; then None for the workers)."""
    config, device = setup.config, setup.device
    world_size = config.tensor_parallel_size
    if config.distributed_executor_backend == "external_launcher":
        rendezvous = Rendezvous.from_torchrun_env(os.environ)
        if rendezvous is None or rendezvous.rank != 0:
            raise ExecutionError(
                "distributed_executor_backend 'external_launcher' runs the engine on rank 0 "
                "of a group torchrun started (RANK 0 and WORLD_SIZE in the environment)"
            )
        if rendezvous.world_size != world_size:
            raise ExecutionError(
                f"torchrun started {rendezvous.world_size} ranks for tensor_parallel_size "
                f"{world_size}"
            )
        if device.type == "cuda":
            torch.cuda.set_device(rendezvous.local_rank)
        return TensorParallelGroup(rendezvous, connect_store(rendezvous), device), None
    if config.node_rank != 0:
        raise ExecutionError(
            f"the engine runs on node 0; node {config.node_rank} runs only its ranks "
            "(hetero-infer serve --node-rank N starts them)"
        )
    rendezvous = Rendezvous.for_node(
        0, world_size, config.nnodes, config.dist_init_addr, os.environ
    )
    listening = _listen(rendezvous)
    rendezvous = dataclasses.replace(rendezvous, port=listening.getsockname()[1])
    local = node_ranks(0, world_size, config.nnodes)
    threads = previous_threads = 0  # on CUDA, torch's defaults
    if device.type == "cpu":
        # This node's ranks share its cores: each one's threads get their share (too
        # many threads spinning on a core make every collective wait on one that is
        # descheduled). This thread does the engine's parallel work (async_engine.py);
        # stop() gives the process its threads back.
        previous_threads = torch.get_num_threads()
        threads = max(1, previous_threads // len(local))
        torch.set_num_threads(threads)
    store = connect_store(rendezvous, listening)
    workers = LocalWorkers.start(config, rendezvous, local[1:], threads, previous_threads)
    try:
        workers.wait_joined(store, world_size)
        tp = TensorParallelGroup(rendezvous, store, device)
    except BaseException:
        workers.stop(timeout=0)
        raise
    if device.type == "cuda":
        workers.watch(tp.abort)
    return tp, workers


def _listen(rendezvous: Rendezvous) -> socket.socket:
    """Rank 0's socket for the store: loopback on one node, dist_init_addr over several."""
    try:
        return listen_on(rendezvous.host, rendezvous.port)
    except OSError as exc:
        raise ExecutionError(
            f"tensor parallel: cannot host the rendezvous at {rendezvous.host}:"
            f"{rendezvous.port} ({exc.strerror or exc}): dist_init_addr must name node 0, "
            "at a free port"
        ) from exc


class LocalWorkers:
    """Ranks of this node other than this process's, as its child processes."""

    def __init__(
        self, processes: list[subprocess.Popen], ranks: Sequence[int], restore_threads: int = 0
    ) -> None:
        self.processes = processes
        self.ranks = list(ranks)
        self.restore_threads = restore_threads
        # Whatever way the engine goes (an error, garbage collection, the interpreter
        # exiting), no rank outlives it.
        self._finalizer = weakref.finalize(self, _kill, list(processes))

    @classmethod
    def start(
        cls,
        config: EngineConfig,
        rendezvous: Rendezvous,
        ranks: Sequence[int],
        threads: int = 0,
        restore_threads: int = 0,
    ) -> LocalWorkers:
        """``ranks``: the global ranks to start here; ``threads``: torch's CPU threads
        for each (0: torch's default); ``restore_threads``: this process's, to set again
        once they stop."""
        settings = json.dumps(config.to_dict())
        processes = []
        for rank in ranks:
            command = [
                sys.executable,
                "-m",
                "hetero_infer.engine.executor.rank_worker",
                f"--rank={rank}",
                f"--world-size={rendezvous.world_size}",
                f"--port={rendezvous.port}",
                f"--threads={threads}",
            ]
            process = subprocess.Popen(command, stdin=subprocess.PIPE, text=True)
            process.stdin.write(settings)
            process.stdin.close()
            processes.append(process)
        if processes:
            logger.info(
                "tensor parallel: started ranks %s (pids %s)",
                ", ".join(str(rank) for rank in ranks),
                ", ".join(str(p.pid) for p in processes),
            )
        return cls(processes, ranks, restore_threads)

    def wait_joined(self, store: Store, world_size: int) -> None:
        """Wait for every other rank, this node's and other nodes', to reach the
        rendezvous, failing at once if one of this node's exits first (joining the
        groups would wait out their timeout)."""
        keys = {rank: joined_key(rank) for rank in range(1, world_size)}
        deadline = time.monotonic() + RENDEZVOUS_TIMEOUT.total_seconds()
        while not store.check(list(keys.values())):
            self.check_alive()
            if time.monotonic() > deadline:
                missing = [str(rank) for rank, key in keys.items() if not store.check([key])]
                raise ExecutionError(
                    f"tensor parallel: ranks {', '.join(missing)} did not join within "
                    f"{RENDEZVOUS_TIMEOUT.total_seconds():.0f} s (every node started, with "
                    "the same dist_init_addr?)"
                )
            time.sleep(0.05)

    def check_alive(self) -> None:
        """ExecutionError naming the first rank that has exited."""
        for rank, process in zip(self.ranks, self.processes, strict=True):
            code = process.poll()
            if code is not None:
                raise ExecutionError(
                    f"tensor-parallel rank {rank} (pid {process.pid}) exited with code {code}"
                )

    def watch(self, on_death: Callable[[], None]) -> None:
        """Call ``on_death`` once from a thread when a worker exits: on CUDA, to abort
        collectives that would otherwise wait for their timeout."""

        def run() -> None:
            while self._finalizer.alive:
                if any(p.poll() is not None for p in self.processes):
                    logger.error("a tensor-parallel rank has exited; aborting collectives")
                    on_death()
                    return
                time.sleep(WATCH_INTERVAL)

        threading.Thread(target=run, name="tp-watch", daemon=True).start()

    def stop(self, timeout: float = 10.0) -> None:
        """Wait up to ``timeout`` seconds for the workers to leave (after the STOP
        command), then kill those left."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
        self._finalizer()
        if self.restore_threads:
            torch.set_num_threads(self.restore_threads)


def _kill(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
    for process in processes:
        process.wait()
