"""Randomness: where every random draw of the engine comes from.

Each draw is a uniform in [0, 1) from Philox (kernels/philox.py), a counter-based
generator: the draw is a pure function of its key and counter, so it needs no
generator object and no state beyond a count. What a draw is keyed by:

- a seeded request's draw at a token position: (its seed; the position, the stream).
  So its tokens depend neither on the batch, nor on how they were spread over steps
  (speculative decoding verifies several positions in one), nor on the thread count;
- an unseeded request's: (the engine's seed; the engine's running count of such
  draws, the stream), in another namespace, so a run of the engine repeats itself.

Streams name the purposes of draws at one position: the sampler's own token, and
speculative decoding's draft model, accept test and residual draw.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch

# The purposes of draws at a position (the counter's lane).
SAMPLE_STREAM = 0
DRAFT_STREAM = 1
ACCEPT_STREAM = 2
RESIDUAL_STREAM = 3
# The lane's high 32 bits: whose key the draw is under.
_ENGINE_NAMESPACE = 1 << 32

# (keys [n] int64, counters [n, 2] int64) -> uniforms [n] float64 (KernelOps.uniforms)
UniformFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Randomness:
    def __init__(self, seed: int, uniform: UniformFn) -> None:
        """``seed``: the engine's (unseeded requests' draws); ``uniform``: Philox, the
        kernels' implementation."""
        self.key = _as_int64(seed)
        self._uniform = uniform
        self._count = itertools.count()

    def uniforms(
        self, seeds: Sequence[int | None], positions: Sequence[int], stream: int
    ) -> torch.Tensor:
        """One uniform per row [n] float64 (on the CPU): a seeded row's at its position,
        an unseeded row's the engine's next."""
        keys, counters = [], []
        for seed, position in zip(seeds, positions, strict=True):
            if seed is None:
                keys.append(self.key)
                counters.append((next(self._count), _ENGINE_NAMESPACE | stream))
            else:
                keys.append(_as_int64(seed))
                counters.append((position, stream))
        return self._uniform(
            torch.tensor(keys, dtype=torch.int64), torch.tensor(counters, dtype=torch.int64)
        )

    def uniform(self, seed: int | None, position: int, stream: int) -> float:
        """One draw (see ``uniforms``)."""
        return float(self.uniforms([seed], [position], stream)[0])


def _as_int64(value: int) -> int:
    """A 64-bit key as a signed int64 (what a torch tensor holds), bits unchanged."""
    value &= 2**64 - 1
    return value - 2**64 if value >= 2**63 else value
