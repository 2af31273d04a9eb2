"""Comparison with per-dtype tolerances that names the mismatching indices, and the cases
of a kernel's argument checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch

# (atol, rtol) of a Triton kernel against its torch reference. fp32: reduction order
# and exp2/rsqrt only. fp16: one or two ulps (5e-4 each near 1). bf16: the interpreter
# rounds fp32 -> bf16 by truncation, so up to two ulps (8e-3 each near 1).
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (3e-2, 3e-2),
}


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = ""
) -> None:
    """assert |actual - expected| <= atol + rtol |expected| elementwise; on failure list
    the first mismatching indices with both values."""
    atol, rtol = TOLERANCES[dtype]
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    actual, expected = actual.float(), expected.float()
    bad = ~torch.isclose(actual, expected, atol=atol, rtol=rtol, equal_nan=False)
    if not bool(bad.any()):
        return
    indices = bad.nonzero().tolist()
    lines = [
        f"  {tuple(i)}: got {actual[tuple(i)].item():.6g}, expected {expected[tuple(i)].item():.6g}"
        for i in indices[:10]
    ]
    diff = (actual - expected).abs().max().item()
    raise AssertionError(
        f"{what}: {len(indices)} of {actual.numel()} elements differ beyond "
        f"atol={atol}, rtol={rtol} ({dtype}); max abs diff {diff:.3g}; first indices:\n"
        + "\n".join(lines)
    )


def refusals(table: Mapping[str, Mapping[str, Any] | Sequence[str]]) -> list[Any]:
    """pytest.param(case, message) for each case of a kernel's refusals: its error
    message -> the cases that break that check, each named by itself (a name) or by its
    key (a mapping of names to cases)."""
    params = []
    for message, cases in table.items():
        named = cases.items() if isinstance(cases, Mapping) else ((case, case) for case in cases)
        params += [pytest.param(case, message, id=name) for name, case in named]
    return params


def strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in its shape, as a view that is not contiguous (each value every
    other element of a buffer twice its size): what a kernel that reads rows in place
    refuses."""
    return torch.stack([t, t], -1)[..., 0]
