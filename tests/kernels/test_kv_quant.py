"""The int8 cache's key rotation (kernels/kv_quant.py): the normalized 32x32 Hadamard
matrix on each group of 32 values, its own inverse, leaving scores unchanged, and
what it is for: a key with an outlier dim comes back from the cache closer."""

from __future__ import annotations

import torch
from hetero_infer.kernels.kv_quant import (
    from_cache,
    keys_from_cache,
    keys_to_cache,
    rotate_groups,
    rotates_keys,
    to_cache,
)


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


def test_each_group_of_32_is_times_the_hadamard_matrix():
    x = randn(3, 2, 64, seed=1)
    groups = x.double().view(3, 2, 2, 32)
    expected = (groups @ sylvester(32)).view(3, 2, 64)
    torch.testing.assert_close(rotate_groups(x).double(), expected, rtol=0, atol=1e-6)


def test_the_rotation_is_its_own_inverse_and_keeps_scores():
    q, k = randn(5, 256, seed=2), randn(7, 256, seed=3)
    torch.testing.assert_close(rotate_groups(rotate_groups(k)), k, rtol=0, atol=1e-5)
    torch.testing.assert_close(rotate_groups(q) @ rotate_groups(k).T, q @ k.T)


def test_only_int8_rows_of_whole_groups_rotate():
    assert rotates_keys(torch.int8, 64) and rotates_keys(torch.int8, 256)
    assert not rotates_keys(torch.int8, 20)  # one scale per row: stored as it is
    assert not any(rotates_keys(d, 64) for d in (torch.bfloat16, torch.float8_e4m3fn))
    key = randn(4, 20, seed=4)
    assert torch.equal(keys_to_cache(key, torch.int8), to_cache(key, torch.int8))


def test_a_key_with_an_outlier_dim_comes_back_closer():
    keys = randn(64, 2, 64, seed=5)
    keys[..., 3] *= 30  # an outlier dim, as keys have: it sets its group's scale
    rotated = keys_from_cache(keys_to_cache(keys, torch.int8), 64, torch.float32)
    unrotated = from_cache(to_cache(keys, torch.int8), 64, torch.float32)
    assert (rotated - keys).pow(2).mean() < 0.5 * (unrotated - keys).pow(2).mean()
