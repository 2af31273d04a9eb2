"""A node other than 0 of ranks spread over several machines (``nnodes``): it starts
its share of the ranks as child processes and waits while they serve rank 0, which
runs the engine on node 0. It ends when they do: 0 once rank 0 has stopped the group,
1 when one of them fails (the others are ended first).

On SIGTERM (or SIGINT) it goes on waiting, for as long as node 0's server drains its
requests (its shutdown_timeout, and a margin): the whole group gets the signal at once
when Kubernetes deletes it, and node 0's requests in flight need every rank until they
finish. Past that wait, or on a second signal, it ends its ranks and exits 128 + the
signal's number, as the server does when a second signal stops it.

The ranks are children rather than this process itself so that this one waits in
Python, where a signal handler runs at once (a rank waits inside gloo for rank 0's next
command, where a handler would not run until it came), and so that a container whose
first process this is stops on SIGTERM (PID 1 gets no default handler from the kernel).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator, Mapping
from types import FrameType

import torch
from hetero_infer.engine.distributed.rendezvous import Rendezvous, node_ranks
from hetero_infer.engine.executor.launcher import LocalWorkers
from hetero_infer.engine.models.sharding import check_divisible
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.setup import resolve_setup

logger = logging.getLogger(__name__)

# How often the ranks' processes are looked at.
POLL_INTERVAL = 0.2
# Past node 0's drain: its stop command comes once its last responses are flushed.
DRAIN_MARGIN = 5.0


def run_node(
    config: EngineConfig, drain_seconds: float = 30.0, environ: Mapping[str, str] = os.environ
) -> int:
    """Run node ``config.node_rank``'s ranks until the group stops; the exit status.
    ``drain_seconds``: node 0's shutdown_timeout, waited for after a signal. Call it
    from the main thread (it handles SIGTERM and SIGINT while it waits)."""
    assert config.node_rank > 0, "node 0 runs the engine, which starts its own ranks"
    world_size = config.tensor_parallel_size
    ranks = node_ranks(config.node_rank, world_size, config.nnodes)
    # What node 0 checks before any rank starts, checked here too: a bad model fails
    # this node with its reason, not its ranks with a rendezvous that never completes.
    setup = resolve_setup(config)
    check_divisible(setup.model_config, world_size)
    threads = 0  # torch's default; on the CPU the node's ranks share its cores
    if setup.device.type == "cpu":
        threads = max(1, torch.get_num_threads() // len(ranks))
    rendezvous = Rendezvous.for_node(
        ranks[0], world_size, config.nnodes, config.dist_init_addr, environ
    )
    logger.info(
        "node %d of %d: ranks %d-%d of %d, rank 0 at %s:%d",
        config.node_rank,
        config.nnodes,
        ranks[0],
        ranks[-1],
        world_size,
        rendezvous.host,
        rendezvous.port,
    )
    with _signals_caught() as caught:
        workers = LocalWorkers.start(config, rendezvous, ranks, threads)
        try:
            return _wait(workers, caught, drain_seconds + DRAIN_MARGIN)
        finally:
            workers.stop(timeout=0)  # ends those still running


def _wait(workers: LocalWorkers, caught: list[int], drain_seconds: float) -> int:
    deadline = None
    while True:
        codes = [process.poll() for process in workers.processes]
        for rank, code in zip(workers.ranks, codes, strict=True):
            if code not in (None, 0):
                logger.error("rank %d exited with code %d: ending this node's ranks", rank, code)
                return 1
        if all(code == 0 for code in codes):
            logger.info("rank 0 stopped the group")
            return 0
        if caught and deadline is None:
            deadline = time.monotonic() + drain_seconds
            logger.info(
                "%s: waiting up to %g s for rank 0 to stop the group (a second signal ends "
                "this node's ranks at once)",
                signal.Signals(caught[0]).name,
                drain_seconds,
            )
        if len(caught) > 1 or (deadline is not None and time.monotonic() > deadline):
            logger.warning("ending this node's ranks before rank 0 stopped the group")
            return 128 + caught[0]
        time.sleep(POLL_INTERVAL)


@contextlib.contextmanager
def _signals_caught() -> Iterator[list[int]]:
    """SIGTERM and SIGINT recorded in the list yielded, instead of ending the process
    (SIGINT: instead of KeyboardInterrupt); the previous handlers back after."""
    caught: list[int] = []

    def record(sig: int, frame: FrameType | None) -> None:
        caught.append(sig)

    previous = {sig: signal.signal(sig, record) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
