"""engine/models/idefics3_vision.py and siglip.py: Idefics3's vision tower and connector
give transformers' image features for the same pixel values, for one tile and many, on
the tiny random SmolVLM-shaped model (tests/tiny_models.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import transformers
from hetero_infer.engine.models.idefics3_vision import (
    Idefics3Vision,
    fractional_position_ids,
    pixel_shuffle,
)
from hetero_infer.engine.models.siglip import SiglipVisionConfig
from hetero_infer.engine.multimodal.idefics3_images import Idefics3ImageProcessor
from safetensors.torch import load_file

from tests.engine.multimodal.test_idefics3_images import IMAGES
from tests.tiny_models import save_tiny_idefics3


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_idefics3(tmp_path_factory.mktemp("idefics3"))


@pytest.fixture(scope="module")
def hf_model(folder: Path) -> transformers.Idefics3ForConditionalGeneration:
    model = transformers.Idefics3ForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def state_dict(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def build(folder: Path, state_dict: dict[str, torch.Tensor]) -> Idefics3Vision:
    config = json.loads((folder / "config.json").read_text())
    with torch.device("meta"):  # as the engine builds its models: no memory until loaded
        vision = Idefics3Vision.from_hf(config)
    vision.load_weights(state_dict)
    return vision


def hf_features(model: transformers.PreTrainedModel, pixel_values: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():  # [1 prompt, tiles, 3, S, S] -> per prompt [tiles * seq, hidden]
        return model.model.get_image_features(pixel_values=pixel_values[None]).pooler_output[0]


def assert_features_close(ours: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to fp32's rounding: the tower sums what transformers' does in another
    order (the patch convolution as one projection, the attention on the C++ kernel),
    and through the tiny model's peaked random weights (features of ~10-100) its
    differences grow to a few millionths of the features' largest (~3e-6 here); a
    difference is held to 1e-5 of it, a slip in the code is of its order."""
    scale = expected.abs().max().item()
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize(
    "image, splitting",
    [("landscape", False), ("landscape", True), ("portrait", True), ("rgba", True)],
)
def test_encode_matches_transformers(
    image: str,
    splitting: bool,
    folder: Path,
    hf_model: transformers.PreTrainedModel,
    state_dict: dict[str, torch.Tensor],
) -> None:
    processor = Idefics3ImageProcessor.from_folder(folder)
    if not splitting:
        processor = dataclasses.replace(processor, do_image_splitting=False)
    pixel_values = processor.process(IMAGES[image]()).pixel_values
    vision = build(folder, state_dict)
    assert vision.image_seq_len == processor.image_seq_len == 16
    ours = vision.encode(pixel_values)
    assert ours.shape == (pixel_values.shape[0] * 16, 64) and ours.dtype == torch.float32
    expected = hf_features(hf_model, pixel_values)
    assert expected.abs().max() > 1
    assert_features_close(ours, expected)


def test_encode_matches_transformers_on_unnatural_pixels(
    folder: Path, hf_model: transformers.PreTrainedModel, state_dict: dict[str, torch.Tensor]
) -> None:
    """Values beyond [-1, 1], three tiles: nothing in the path relies on real images."""
    pixel_values = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 2
    vision = build(folder, state_dict)
    expected = hf_features(hf_model, pixel_values)
    assert_features_close(vision.encode(pixel_values), expected)


def test_encode_in_the_weights_dtype(folder: Path, state_dict: dict[str, torch.Tensor]) -> None:
    pixel_values = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    full = build(folder, state_dict).encode(pixel_values)
    bf16 = build(folder, {name: t.to(torch.bfloat16) for name, t in state_dict.items()})
    half = bf16.encode(pixel_values)
    assert half.dtype == torch.bfloat16
    # bf16 keeps 8 bits: a few percent of the features' spread, through 2 layers
    torch.testing.assert_close(half.float(), full, rtol=0.1, atol=0.1 * full.std().item())


@pytest.mark.parametrize(
    "config",
    [{"vision_config": {"image_size": 256}}, {"scale_factor": 7}],
    ids=["image size", "scale factor"],
)
def test_a_config_without_vision_keys_takes_transformers_defaults(config: dict) -> None:
    """transformers saves only what differs from its defaults: a config.json without them
    builds what Idefics3Config's defaults build. (Not all of them: 224 pixels in patches
    of 32 make 7 a side, which a scale factor of 2 does not split.)"""
    hf = transformers.Idefics3Config(**config)
    with torch.device("meta"):
        vision = Idefics3Vision.from_hf(config)
        assert Idefics3Vision.from_hf(hf).vision_model.config == vision.vision_model.config
    assert vision.vision_model.config == SiglipVisionConfig.from_hf(hf.vision_config.to_dict())
    assert vision.scale_factor == hf.scale_factor
    vision_hidden = hf.vision_config.hidden_size * hf.scale_factor**2
    assert vision.projection.weight.shape == (hf.text_config.hidden_size, vision_hidden)


def test_load_weights_names_what_is_missing(
    folder: Path, state_dict: dict[str, torch.Tensor]
) -> None:
    config = json.loads((folder / "config.json").read_text())
    vision = Idefics3Vision.from_hf(config)
    partial = {k: v for k, v in state_dict.items() if "post_layernorm" not in k}
    with pytest.raises(ValueError, match="post_layernorm"):
        vision.load_weights(partial)


@pytest.mark.parametrize("patches_per_side", [2, 8, 19, 25, 26, 27, 32, 38])
def test_position_ids_match_transformers(patches_per_side: int) -> None:
    """Idefics3's bucketed fractional positions, which for 19, 25 and 38 patches a side
    give a few patches their neighbour's embedding: read back from transformers' own
    embeddings, with zero patch weights and each position's embedding its index."""
    config = transformers.Idefics3VisionConfig(
        hidden_size=4, image_size=patches_per_side * 2, patch_size=2
    )
    embeddings = transformers.models.idefics3.modeling_idefics3.Idefics3VisionEmbeddings(config)
    num_patches = patches_per_side**2
    with torch.no_grad():
        embeddings.patch_embedding.weight.zero_()
        embeddings.patch_embedding.bias.zero_()
        embeddings.position_embedding.weight.copy_(
            torch.arange(num_patches, dtype=torch.float32)[:, None].expand(-1, 4)
        )
        side = patches_per_side * 2
        mask = torch.ones(1, patches_per_side, patches_per_side, dtype=torch.bool)
        read_back = embeddings(torch.zeros(1, 3, side, side), mask)[0, :, 0].long()
    assert torch.equal(fractional_position_ids(patches_per_side), read_back)


def test_pixel_shuffle_folds_blocks_of_patches() -> None:
    """A 4 x 4 grid of patches, each its own index: the first vector holds patches 0, 1
    (row 0) and 4, 5 (row 1), the second 2, 3, 6, 7."""
    patches = torch.arange(16, dtype=torch.float32).view(1, 16, 1)
    blocks = pixel_shuffle(patches, 2)
    assert blocks.shape == (1, 4, 4)
    assert blocks[0].tolist() == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]
