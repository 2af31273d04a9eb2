"""The engine thread's hand-over points: the one thread that builds the engine and runs
its steps (async_engine.py says why one), the requests handed to it, and the futures
the event loop awaits for what it did with them.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hetero_infer.engine.frontend.input_processor import EngineRequest


@dataclass
class NewRequest:
    request: EngineRequest
    # Settled on the event loop once the engine thread has taken the request.
    accepted: asyncio.Future = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def settle(future: asyncio.Future, error: BaseException | None, result: Any = None) -> None:
    """Accept a request (or refuse it with ``error``), unless its caller has gone."""
    if future.done():  # cancelled: the client left while it waited; its abort follows
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def engine_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
