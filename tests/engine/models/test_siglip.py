"""engine/models/siglip.py: the patch convolution of a checkpoint, loaded by its names,
embeds the patches as torch's convolution does (one projection of each patch's pixels)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hetero_infer.engine.models.layers import pack_linears
from hetero_infer.engine.models.siglip import (
    SiglipVisionConfig,
    SiglipVisionEmbeddings,
    SiglipVisionTransformer,
)
from hetero_infer.kernels import KernelOps


def test_the_patch_projection_is_the_checkpoints_convolution() -> None:
    config = SiglipVisionConfig(8, 16, 1, 2, image_size=8, patch_size=4)
    embeddings = SiglipVisionEmbeddings(config, torch.tensor([2, 0, 3, 1]), KernelOps())
    generator = torch.Generator().manual_seed(0)
    checkpoint = {
        "patch_embedding.weight": torch.randn(8, 3, 4, 4, generator=generator),
        "patch_embedding.bias": torch.randn(8, generator=generator),
        "position_embedding.weight": torch.randn(4, 8, generator=generator),
    }
    missing, unexpected = embeddings.load_state_dict(dict(checkpoint), strict=False)
    assert not missing and not unexpected
    embeddings.patch_projection.pack_weight()
    pixels = torch.randn(2, 3, 8, 8, generator=generator)
    convolved = F.conv2d(
        pixels, checkpoint["patch_embedding.weight"], checkpoint["patch_embedding.bias"], stride=4
    )
    # [tiles, hidden, 2, 2] -> the patches row by row, each plus its position's embedding
    positions = checkpoint["position_embedding.weight"][[2, 0, 3, 1]]
    expected = convolved.flatten(2).transpose(1, 2) + positions
    # fp32 sums of 48 products, in another order: ~1e-6 apart on some CPUs
    torch.testing.assert_close(embeddings(pixels), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 8, 4), (2, 1, 8, 8), (3, 8, 8), (1, 2, 3, 8, 8)])
def test_pixel_values_of_another_shape_are_refused(shape: tuple[int, ...]) -> None:
    config = SiglipVisionConfig(8, 16, 1, 2, image_size=8, patch_size=4)
    tower = SiglipVisionTransformer(config, KernelOps())
    pack_linears(tower)
    assert tower(torch.zeros(2, 3, 8, 8)).shape == (2, 4, 8)  # 4 patches of 8 values each
    expected = rf"pixel values of shape \({shape[0]}, .* takes \[tiles, 3, 8, 8\]"
    with pytest.raises(ValueError, match=expected):
        tower(torch.zeros(shape))
