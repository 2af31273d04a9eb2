"""The greedy pick (argmax token and its log-probability per row): the C++ kernel, as
the engine selects it on the CPU, against the torch reference."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.kernels import select_kernels
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.greedy import greedy_pick_ref

greedy_pick = select_kernels("auto", torch.device("cpu")).ops.greedy_pick


def logits_of(rows: int, vocab: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return (4 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("rows", "vocab"), [(1, 49152), (7, 1000), (130, 517), (3, 1)])
def test_kernel_matches_reference(dtype, rows, vocab):
    assert load_cpu_kernels() is not None
    logits = logits_of(rows, vocab, dtype)
    tokens, logprobs = greedy_pick(logits)
    ref_tokens, ref_logprobs = greedy_pick_ref(logits)
    assert torch.equal(tokens, ref_tokens)
    assert logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs, ref_logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pick", [greedy_pick, greedy_pick_ref])
def test_without_logprobs_the_tokens_are_the_same_and_the_logprobs_nan(pick):
    logits = logits_of(5, 3000, torch.bfloat16, seed=1)
    tokens, logprobs = pick(logits, False)
    assert torch.equal(tokens, greedy_pick_ref(logits)[0])
    assert logprobs.shape == (5,) and bool(logprobs.isnan().all())


@pytest.mark.parametrize("threads", [1, 2])
def test_ties_go_to_the_first_index_as_in_torch_argmax(threads):
    # On one thread the rows follow each other through the same buffer: a row's values
    # must not be read from the row before (a strict-aliasing bug once did that).
    logits = torch.zeros(3, 40, dtype=torch.bfloat16)
    logits[0, [5, 17, 39]] = 2.0
    logits[1, [0, 1]] = 1.0
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tokens, logprobs = greedy_pick(logits)
    finally:
        torch.set_num_threads(previous)
    assert tokens.tolist() == [5, 0, 0]
    torch.testing.assert_close(logprobs[2], torch.tensor(-torch.log(torch.tensor(40.0)).item()))


@pytest.mark.parametrize(
    "logits",
    [
        torch.zeros(8),  # one row without its rows' dimension
        torch.zeros(3, 8)[:, ::2],  # a strided view: the kernel reads rows whole
        torch.zeros(3, 0),  # no vocabulary: no token to pick
    ],
    ids=["1-d", "strided", "empty-rows"],
)
def test_kernel_refuses_logits_it_cannot_read(logits):
    with pytest.raises(RuntimeError, match=r"contiguous \[rows, vocab\]"):
        load_cpu_kernels().greedy_pick(logits, True)
