"""A tensor-parallel rank other than 0: its share of the model and of the KV cache, and
a loop that runs what rank 0 sends.

It builds the same ModelRunner as rank 0 (so load, KV sizing and the CUDA memory
profile run in step with it, collectives included), then waits for commands
(step_broadcast.py): a step's forward pass, a batch of logits, or stop. The scheduler,
the sampler and the front end live on rank 0 only.

Started as ``python -m hetero_infer.engine.executor.rank_worker --rank R --world-size N
--port P`` with the engine's settings as JSON on standard input, by rank 0 for its
node's other ranks or by a node's process for that node's ranks (node.py); or by
torchrun through the command line (server/cli.py), which calls ``run_worker``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

import torch
from hetero_infer.engine.distributed.process_group import (
    TensorParallelGroup,
    connect_store,
)
from hetero_infer.engine.distributed.rendezvous import Rendezvous
from hetero_infer.engine.distributed.step_broadcast import Command, Step, StepReceiver
from hetero_infer.engine.executor.launcher import joined_key
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.setup import resolve_setup
from hetero_infer.engine.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def run_worker(config: EngineConfig, rendezvous: Rendezvous) -> None:
    """Join the group, load this rank's share, and serve rank 0's commands until STOP
    (or until rank 0 is gone, which ends the wait with an error)."""
    setup = resolve_setup(config)  # as rank 0 resolves it: the same config, the same result
    if setup.device.type == "cuda":
        torch.cuda.set_device(rendezvous.local_rank)
    store = connect_store(rendezvous)
    store.set(joined_key(rendezvous.rank), "1")
    tp = TensorParallelGroup(rendezvous, store, setup.device)
    runner = ModelRunner(setup, tp)
    serve_commands(runner, StepReceiver(tp, runner.dtype))


@torch.inference_mode()
def serve_commands(runner: ModelRunner, receiver: StepReceiver) -> None:
    while True:
        command, payload = receiver.receive()
        if command == Command.STOP:
            return
        if command == Command.STEP:
            assert isinstance(payload, Step)
            runner.execute_share(
                payload.copies,
                payload.input_ids,
                payload.positions,
                payload.attention_inputs,
                payload.image_embeds,
            )
        elif command == Command.LOGITS:
            assert isinstance(payload, torch.Tensor)
            runner.compute_logits_share(payload)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A tensor-parallel rank started by its node.")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, help="torch's CPU threads for this rank")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config = EngineConfig.from_dict(json.loads(sys.stdin.read()), "rank 0's settings")
    if args.threads:
        torch.set_num_threads(args.threads)
    # Where the ranks meet and this rank's GPU follow from the nodes' settings (node 0's
    # port, on one node, is the one rank 0 picked).
    rendezvous = Rendezvous.for_node(
        args.rank, args.world_size, config.nnodes, config.dist_init_addr, os.environ
    )
    rendezvous = dataclasses.replace(rendezvous, port=args.port)
    try:
        run_worker(config, rendezvous)
    except RuntimeError as exc:  # rank 0 went away: its sockets closed
        logger.error("tensor-parallel rank %d stops: %s", args.rank, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
