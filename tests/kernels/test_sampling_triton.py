"""The Triton sampler against the torch reference (interpreter), on the batches the C++
kernel is checked with, in one big tile and in tiles of 256 tokens (as on a GPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hetero_infer.kernels.sampling import sample_ref  # noqa: E402
from hetero_infer.kernels.sampling_triton import sample_triton  # noqa: E402
from hetero_infer.kernels.triton_utils import DeviceInfo  # noqa: E402

from tests.kernels.test_sampling import FEATURES, check_same, random_batch  # noqa: E402

# (tiles, (rows, vocab, scale), features): each pair of these choices meets in one case.
# "one-program" reads a row in one tile; "small-tiles" in tiles of 256 tokens, the last
# one partial. The features (penalties, bias, banned and disallowed tokens) are applied
# before the kernel: they change its rows (-inf where a token is excluded), not its code.
CASES = [
    ("one-program", (12, 700, 3.0), ()),
    ("one-program", (6, 1000, 0.3), FEATURES),
    ("small-tiles", (12, 700, 3.0), FEATURES),
    ("small-tiles", (6, 1000, 0.3), ()),
]
CASE_IDS = [
    f"{tiles}-{rows}x{vocab}{'-features' if f else ''}" for tiles, (rows, vocab, _), f in CASES
]


@pytest.mark.parametrize(("tiles", "shape", "features"), CASES, ids=CASE_IDS)
def test_triton_matches_reference(tiles, shape, features, monkeypatch):
    if tiles == "small-tiles":
        monkeypatch.setattr(DeviceInfo, "max_tile", property(lambda self: 256))
    rows, vocab, scale = shape
    seed = rows + vocab
    logits = scale * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))
    tensors = random_batch(rows, vocab, seed, features)
    check_same(sample_triton(logits, tensors), sample_ref(logits, tensors))


@pytest.mark.parametrize("feature", FEATURES)
def test_triton_matches_reference_with_one_feature(feature):
    """The kernel skips the features' pass when no row has any: each alone must run it."""
    logits = 3 * torch.randn(6, 300, generator=torch.Generator().manual_seed(3))
    tensors = random_batch(6, 300, 3, [feature])
    check_same(sample_triton(logits, tensors), sample_ref(logits, tensors))


@pytest.mark.cuda
def test_triton_matches_reference_on_the_gpu():
    logits = 4 * torch.randn(16, 49152, generator=torch.Generator().manual_seed(1))
    tensors = random_batch(16, 49152, 1)
    tokens, logprobs = sample_triton(logits.cuda(), tensors.to(torch.device("cuda")))
    check_same((tokens.cpu(), logprobs.cpu()), sample_ref(logits, tensors))
