"""ParentRequest: a request with n > 1 choices, fanned out into one sequence per choice.

The caller's request id names the whole request; choice 0 keeps it and choice i is
``{id}#{i}``. A seeded request seeds choice i with seed + i (as vLLM does), so every
choice is reproducible and the choices differ.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hetero_infer.engine.params.sampling_params import SamplingParams


def choice_id(request_id: str, index: int) -> str:
    """The sequence id of choice ``index`` of a request (choice 0 keeps the request's)."""
    return request_id if index == 0 else f"{request_id}#{index}"


@dataclass(frozen=True)
class ParentRequest:
    request_id: str
    params: SamplingParams

    @property
    def choice_ids(self) -> list[str]:
        return [choice_id(self.request_id, i) for i in range(self.params.n)]

    def choice_params(self, index: int) -> SamplingParams:
        """Choice ``index``'s own params: n = 1, and seed + index where seeded."""
        if self.params.n == 1:
            return self.params
        seed = None if self.params.seed is None else (self.params.seed + index) % 2**63
        return dataclasses.replace(self.params, n=1, seed=seed)
