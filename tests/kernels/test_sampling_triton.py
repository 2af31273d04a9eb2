"""The Triton sampler against the torch reference (interpreter), on the batches the C++
kernel is checked with, in one big tile and in tiles of 256 tokens (as on a GPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hetero_infer.kernels.sampling import sample_ref  # noqa: E402
from hetero_infer.kernels.sampling_triton import sample_triton  # noqa: E402
from hetero_infer.kernels.triton_utils import DeviceInfo  # noqa: E402

from tests.kernels.test_sampling import check_same, random_batch  # noqa: E402


@pytest.fixture(autouse=True, params=["one-program", "small-tiles"])
def tiles(request, monkeypatch):
    if request.param == "small-tiles":
        monkeypatch.setattr(DeviceInfo, "max_tile", property(lambda self: 256))


@pytest.mark.parametrize("features", [False, True])
@pytest.mark.parametrize(("rows", "vocab", "scale"), [(12, 700, 3.0), (6, 1000, 0.3)])
def test_triton_matches_reference(rows, vocab, scale, features):
    seed = rows + vocab
    logits = scale * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))
    tensors = random_batch(rows, vocab, seed, features)
    check_same(sample_triton(logits, tensors), sample_ref(logits, tensors))


@pytest.mark.cuda
def test_triton_matches_reference_on_the_gpu():
    logits = 4 * torch.randn(16, 49152, generator=torch.Generator().manual_seed(1))
    tensors = random_batch(16, 49152, 1)
    tokens, logprobs = sample_triton(logits.cuda(), tensors.to(torch.device("cuda")))
    check_same((tokens.cpu(), logprobs.cpu()), sample_ref(logits, tensors))
