"""ResponseStore: the responses of /v1/responses kept in memory, the most recently used
``capacity`` of them, for ``previous_response_id`` and GET /v1/responses/{id}.

OpenAI keeps responses (``store`` defaults to true) for 30 days. vLLM ignores ``store``
unless VLLM_ENABLE_RESPONSES_API_STORE is set, and then keeps every response in a dict
that only grows. Here they are kept by default, but only so many: the least recently
used goes first, so memory stays bounded whatever clients send. Each entry holds the
whole conversation that led to it, so a conversation continues even after the earlier
responses in its chain have gone. The store lives in the server process: restarts and
replicas do not share it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# How many responses are kept. Each holds its conversation, which fitted the model's
# context: at most a few hundred KB of text each.
MAX_STORED_RESPONSES = 512


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the response object, as GET answers it
    # Input items of the whole conversation, then this response's output items.
    conversation: list[dict[str, Any]]


class ResponseStore:
    """An LRU of responses by id. Used from the event loop only, so without locks."""

    def __init__(self, capacity: int = MAX_STORED_RESPONSES) -> None:
        assert capacity > 0
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        """The response, which counts as a use; None if unknown or evicted."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None
