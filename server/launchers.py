"""Where this process stands among the tensor-parallel ranks when a launcher started
it: under torchrun (its RANK and WORLD_SIZE), or as one node of several, as Kubernetes'
LeaderWorkerSet starts a group of pods (its LWS_* variables give the node settings'
defaults). The command line (cli.py) asks here before it loads anything: rank 0 and
node 0 go on to run the engine (and the server); the others run only their ranks."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from hetero_infer.engine.distributed.rendezvous import Rendezvous
from hetero_infer.engine.entrypoints.process_settings import apply_process_settings
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.dist_init_addr import DEFAULT_PORT
from hetero_infer.engine.settings.exceptions import EngineError

# LeaderWorkerSet's variables in every container of a group -> the engine's settings.
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"  # pods in the group: nnodes
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"  # this pod's index, the leader's 0: node_rank
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"  # the leader pod's DNS name: dist_init_addr


def lws_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The node settings LeaderWorkerSet's variables give (nnodes, node_rank and
    dist_init_addr at the leader's port DEFAULT_PORT), as defaults under the flags and
    HETERO_* variables; none under torchrun, which places the ranks itself."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return {}
    values: dict[str, Any] = {}
    for variable, name in ((LWS_GROUP_SIZE, "nnodes"), (LWS_WORKER_INDEX, "node_rank")):
        if (text := environ.get(variable)) is not None:
            try:
                values[name] = int(text)
            except ValueError:
                raise ValueError(f"{variable}: expected an integer, got {text!r}") from None
    if leader := environ.get(LWS_LEADER_ADDRESS):
        host = f"[{leader}]" if ":" in leader else leader  # an IPv6 address's colons
        values["dist_init_addr"] = f"{host}:{DEFAULT_PORT}"
    return values


def under_torchrun(
    config: EngineConfig, environ: Mapping[str, str] = os.environ
) -> tuple[EngineConfig, int]:
    """Under torchrun (its RANK and WORLD_SIZE set, more than one rank), the config for
    ranks it started, and this process's rank; otherwise the config as it is and 0.
    Rank 0 runs the engine (and the server); the others only their share of the model."""
    rendezvous = Rendezvous.from_torchrun_env(environ)
    if rendezvous is None or rendezvous.world_size == 1:
        return config, 0
    if config.tensor_parallel_size != rendezvous.world_size:
        raise ValueError(
            f"torchrun started {rendezvous.world_size} ranks: give --tensor-parallel-size "
            f"{rendezvous.world_size}"
        )
    return config.replace(distributed_executor_backend="external_launcher"), rendezvous.rank


def run_torchrun_worker(config: EngineConfig, environ: Mapping[str, str] = os.environ) -> int:
    """A rank other than 0 under torchrun: its share of the model until rank 0 stops."""
    from hetero_infer.engine.executor.rank_worker import run_worker

    rendezvous = Rendezvous.from_torchrun_env(environ)
    assert rendezvous is not None
    apply_process_settings(config)
    try:
        run_worker(config, rendezvous)
    except RuntimeError as exc:  # rank 0 went away without stopping the group
        print(f"error: tensor-parallel rank {rendezvous.rank}: {exc}", file=sys.stderr)
        return 1
    return 0


def run_other_node(config: EngineConfig, drain_seconds: float) -> int:
    """A node other than 0 (``config.node_rank`` > 0): its ranks, no server, until rank 0
    stops the group (engine/executor/node.py), which may take node 0's drain,
    ``drain_seconds``, after a signal; the exit status."""
    from hetero_infer.engine.executor.node import run_node  # torch is only needed here

    apply_process_settings(config)
    try:
        return run_node(config, drain_seconds)
    except EngineError as exc:  # the model or the device, found wanting before any rank
        print(f"error: node {config.node_rank}: {exc}", file=sys.stderr, flush=True)
        return 1
