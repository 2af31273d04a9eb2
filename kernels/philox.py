"""Philox4x32-10, the counter-based generator every random draw of the engine comes from.

A counter-based generator is a keyed hash: the output for (key, counter) is fixed,
needs no state, and costs the same whichever counters come before it. A draw is named
by what it is for (a request's seed as the key; the token position and the purpose as
the counter), so it is the same alone, in any batch, on any thread count and on any
device, and there is no generator per request to create, seed or keep.

Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011;
the generator of cuRAND, JAX and Triton's ``tl.rand``): a 64-bit key and a 128-bit
counter give four 32-bit words through ten rounds of two 32x32 -> 64-bit multiplies.
Two of the words make one uniform double in [0, 1) with 53 random bits.

This file is the reference, in Python integers; the C++ kernels (kernels/csrc/
sampler_cpu.cpp) compute the same words, and tests check they agree.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # the round multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # the key's increments between rounds (Weyl)
ROUNDS = 10


def philox4x32(key: int, counter: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """The four output words for a 64-bit ``key`` and four 32-bit counter words."""
    k0, k1 = key & _MASK32, (key >> 32) & _MASK32
    c0, c1, c2, c3 = counter
    for _ in range(ROUNDS):
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = (
            (p1 >> 32) ^ c1 ^ k0,
            p1 & _MASK32,
            (p0 >> 32) ^ c3 ^ k1,
            p0 & _MASK32,
        )
        k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
    return c0, c1, c2, c3


def uniform(key: int, position: int, lane: int) -> float:
    """A uniform double in [0, 1) for (key, position, lane): ``position`` fills the first
    two counter words, ``lane`` (32 bits of purpose, 32 of namespace) the last two."""
    words = philox4x32(
        key, (position & _MASK32, (position >> 32) & _MASK32, lane & _MASK32, lane >> 32)
    )
    # 27 + 26 bits, as a 53-bit fraction (the usual way to fill a double's mantissa).
    return ((words[0] >> 5) * 2**26 + (words[1] >> 6)) / 2**53


def uniforms_ref(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """keys [n] int64, counters [n, 2] int64 (position, lane) -> [n] float64 uniforms."""
    return torch.tensor(
        [
            uniform(key & (2**64 - 1), position & (2**64 - 1), lane & (2**64 - 1))
            for key, (position, lane) in zip(keys.tolist(), counters.tolist(), strict=True)
        ],
        dtype=torch.float64,
    )
