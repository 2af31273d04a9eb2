"""Pieces every family's answers are made of, whatever their wire format: ids,
timestamps, and a stream with its first item put back (each family's stream reads its
first item before its status line goes out, so that a request refused before any
output still gets its status code)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


async def prepend(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """``first``, then the items of ``rest``."""
    yield first
    async for item in rest:
        yield item
