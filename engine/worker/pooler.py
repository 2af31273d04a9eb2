"""Pooler: an embedding request's final hidden states -> one vector (PoolingParams).

"last" takes the final hidden state (after the model's final norm) of the prompt's last
token, the one that has attended to the whole prompt: the pooling vLLM gives decoder
models served for embeddings. "mean" averages it over every prompt position.

A prompt prefilled in chunks is pooled across steps: "last" needs only the last chunk,
while "mean" keeps a running fp32 sum per request until its last chunk. The sum takes
each position once, so a prompt recomputed after a preemption (from position 0 again)
is not counted twice. Mean pooling needs every position's hidden state, so such a
request never takes its prompt from the prefix cache (Sequence.needs_every_prompt_position).

The vector is normalized to unit L2 length unless the request says not to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hetero_infer.engine.core.step_data import ScheduledSequence


class Pooler:
    def __init__(self) -> None:
        # Mean pooling mid-prefill, per request: the fp32 sum [hidden] of the final
        # hidden states of its first ``count`` prompt positions, and ``count``.
        self._sums: dict[str, tuple[torch.Tensor, int]] = {}

    def forget(self, request_ids: list[str]) -> None:
        """Drop the sums of requests that ended (finished or aborted) mid-prefill."""
        for request_id in request_ids:
            self._sums.pop(request_id, None)

    def __call__(
        self, scheduled: list[ScheduledSequence], hidden: torch.Tensor
    ) -> dict[str, list[float]]:
        """The pooled vectors of the embedding requests whose prompt this step completed.
        ``hidden``: [num_tokens, hidden], the step's tokens in ``scheduled`` order."""
        pooled: dict[str, list[float]] = {}
        offset = 0
        for item in scheduled:
            start, offset = offset, offset + item.num_new_tokens
            if item.pooling is None:  # most: no slice of hidden (a tensor op each)
                continue
            rows = hidden[start:offset]  # [num_new_tokens, hidden]
            if item.pooling.kind == "mean":
                self._add(item, rows)
            if not item.returns_embedding:
                continue
            if item.pooling.kind == "last":
                vector = rows[-1].float()
            else:
                total, count = self._sums.pop(item.request_id)
                assert count == item.start + item.num_new_tokens, "a prompt position was skipped"
                vector = total / count
            if item.pooling.normalize:
                vector = F.normalize(vector, dim=0)
            pooled[item.request_id] = vector.tolist()
        return pooled

    def _add(self, item: ScheduledSequence, rows: torch.Tensor) -> None:
        """Add the chunk's positions not yet in the request's sum."""
        total, count = self._sums.get(item.request_id, (None, 0))
        assert item.start <= count, "mean pooling needs every prompt position in order"
        new = rows[count - item.start :]
        if new.shape[0] == 0:
            return
        chunk_sum = new.float().sum(dim=0)
        total = chunk_sum if total is None else total + chunk_sum
        self._sums[item.request_id] = (total, count + new.shape[0])
