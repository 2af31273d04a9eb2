"""The greedy pick (argmax token and its log-probability per row): the C++ kernel
against the torch reference."""

from __future__ import annotations

import pytest
import torch
from hetero_infer import kernels
from hetero_infer.kernels.cpu_extension import cpu_kernels
from hetero_infer.kernels.greedy import greedy_pick_ref


def logits_of(rows: int, vocab: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return (4 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("rows", "vocab"), [(1, 49152), (7, 1000), (130, 517)])
def test_kernel_matches_reference(dtype, rows, vocab):
    assert cpu_kernels() is not None
    logits = logits_of(rows, vocab, dtype)
    tokens, logprobs = kernels.greedy_pick(logits)
    ref_tokens, ref_logprobs = greedy_pick_ref(logits)
    assert torch.equal(tokens, ref_tokens)
    assert logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs, ref_logprobs, rtol=1e-5, atol=1e-5)


def test_ties_go_to_the_first_index_as_in_torch_argmax():
    logits = torch.zeros(3, 40, dtype=torch.bfloat16)
    logits[0, [5, 17, 39]] = 2.0
    logits[1, [0, 1]] = 1.0
    tokens, logprobs = kernels.greedy_pick(logits)
    assert tokens.tolist() == [5, 0, 0]
    torch.testing.assert_close(logprobs[2], torch.tensor(-torch.log(torch.tensor(40.0)).item()))
