"""Process-wide settings the engine runs best with, applied once by an entry point
(the command line, the server, the benchmarks) from the config: importing a module of
the engine changes nothing about the process.

    set_openmp_wait_policy()         # before anything imports torch
    apply_process_settings(config)   # before the engine loads its model
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping

from hetero_infer.engine.settings.config import EngineConfig

logger = logging.getLogger(__name__)

# How long torch's OpenMP threads spin before they sleep between parallel regions. A
# decode step runs hundreds of short regions: waking sleeping threads for each one
# made a batch-1 step 18 ms where spinning threads took 13 ms. But a thread that spins
# holds its core while the one it waits for may have lost its own to another process,
# so they spin a short while (~0.2 ms) and then sleep. Longer spins gained at most
# 1.09x on an idle machine and fell 10x beside one busy process (bench/openmp_spin.py,
# docs/cpu.md); there sleeping at once (OMP_WAIT_POLICY=PASSIVE) is 2.9x this count.
OPENMP_SPIN_COUNT = "10000"


def set_openmp_wait_policy(environ: MutableMapping[str, str] = os.environ) -> None:
    """Have OpenMP threads spin briefly between parallel regions. libgomp reads this
    when torch loads, so call it before anything imports torch; an explicit
    OMP_WAIT_POLICY or GOMP_SPINCOUNT wins."""
    if "OMP_WAIT_POLICY" not in environ:
        environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN_COUNT)


def apply_process_settings(config: EngineConfig) -> None:
    """What the engine on ``config``'s device wants of the process: on the CPU, malloc
    keeps freed activations for the next step (engine/settings/host_memory.py)."""
    from hetero_infer.engine.settings import host_memory
    from hetero_infer.engine.setup import resolve_device

    if resolve_device(config.device).type == "cpu" and host_memory.keep_freed_memory():
        logger.debug("malloc keeps freed blocks up to 32 MB for reuse")
