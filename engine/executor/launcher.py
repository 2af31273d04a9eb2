"""Rank 0's side of starting the group: the other ranks as local processes (or joining
the ranks torchrun started), and watching that they stay alive.

A local rank is a fresh Python process running engine/executor/rank_worker.py. It is
given its rank, the group's size and the rendezvous port on its command line and the
engine's settings as JSON on its standard input: no pickled object crosses, and the
rendezvous and gloo's connections listen on loopback only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable

import torch
from hetero_infer.engine.distributed.process_group import (
    RENDEZVOUS_TIMEOUT,
    TensorParallelGroup,
    connect_store,
    listen_on_loopback,
)
from hetero_infer.engine.distributed.rendezvous import Rendezvous
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
    threads = previous_threads = 0  # on CUDA, torch's defaults
    if device.type == "cpu":
        # The ranks share this machine's cores: each one's threads get their share (too
        # many threads spinning on a core make every collective wait on one that is
        # descheduled). This thread does the engine's parallel work (async_engine.py);
        # stop() gives the process its threads back.
        previous_threads = torch.get_num_threads()
        threads = max(1, previous_threads // world_size)
        torch.set_num_threads(threads)
    listening = listen_on_loopback()
    rendezvous = Rendezvous(rank=0, world_size=world_size, port=listening.getsockname()[1])
    store = connect_store(rendezvous, listening)
    workers = LocalWorkers.start(config, rendezvous, threads, previous_threads)
    try:
        workers.wait_joined(store)
        tp = TensorParallelGroup(rendezvous, store, device)
    except BaseException:
        workers.stop(timeout=0)
        raise
    if device.type == "cuda":
        workers.watch(tp.abort)
    return tp, workers


class LocalWorkers:
    """Ranks 1 .. N-1 as child processes of this one."""

    def __init__(self, processes: list[subprocess.Popen], restore_threads: int = 0) -> None:
        self.processes = processes
        self.restore_threads = restore_threads
        # Whatever way the engine goes (an error, garbage collection, the interpreter
        # exiting), no rank outlives it.
        self._finalizer = weakref.finalize(self, _kill, list(processes))

    @classmethod
    def start(
        cls,
        config: EngineConfig,
        rendezvous: Rendezvous,
        threads: int = 0,
        restore_threads: int = 0,
    ) -> LocalWorkers:
        """``threads``: torch's CPU threads for each worker (0: torch's default);
        ``restore_threads``: this process's, to set again once they stop."""
        settings = json.dumps(config.to_dict())
        processes = []
        for rank in range(1, rendezvous.world_size):
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
        logger.info(
            "tensor parallel: started ranks 1-%d (pids %s)",
            rendezvous.world_size - 1,
            ", ".join(str(p.pid) for p in processes),
        )
        return cls(processes, restore_threads)

    def wait_joined(self, store: Store) -> None:
        """Wait for every worker to reach the rendezvous, failing at once if one exits
        first (joining the groups would wait out their timeout)."""
        keys = [joined_key(rank) for rank in range(1, len(self.processes) + 1)]
        deadline = time.monotonic() + RENDEZVOUS_TIMEOUT.total_seconds()
        while not store.check(keys):
            self.check_alive()
            if time.monotonic() > deadline:
                raise ExecutionError("tensor parallel: the other ranks did not start in time")
            time.sleep(0.05)

    def check_alive(self) -> None:
        """ExecutionError naming the first rank that has exited."""
        for rank, process in enumerate(self.processes, start=1):
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
