"""engine/multimodal/idefics3_images.py: one image's tiles equal transformers' Idefics3
image processor's to the bit, and the prompt text for them tokenizes to the ids
Idefics3Processor gives, for images of every shape and mode, splitting on and off."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch
import transformers
from hetero_infer.engine.multimodal import pixels
from hetero_infer.engine.multimodal.idefics3_images import Idefics3ImageProcessor

from tests.tiny_models import IDEFICS3_TILE_SIZE, pil_processor, save_tiny_idefics3

PROMPT = "User:<image>What is in the picture?<end_of_utterance>\nAssistant:"


def noise(mode: str, width: int, height: int, seed: int = 0) -> PIL.Image.Image:
    """Random pixels: every resampling filter tap shows in them, unlike in flat colour."""
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}[mode]
    pixels = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
    return PIL.Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode=mode)


def palette_with_transparency() -> PIL.Image.Image:
    image = noise("RGB", 70, 45, seed=3).quantize(colors=16)
    image.info["transparency"] = 5  # palette entry 5 is see-through: it becomes white
    return image


# (width, height) and mode; the tiles are 64 pixels, the longest edge resized to 256.
IMAGES = {
    "landscape": lambda: noise("RGB", 300, 170),
    "portrait": lambda: noise("RGB", 90, 400, seed=1),
    "rgba": lambda: noise("RGBA", 123, 77, seed=2),
    "greyscale": lambda: noise("L", 50, 61, seed=4),
    "greyscale_alpha": lambda: noise("LA", 33, 20, seed=5),
    "palette": palette_with_transparency,
    "one_pixel": lambda: noise("RGB", 1, 1, seed=6),
    "one_by_three": lambda: noise("RGB", 1, 3, seed=7),
    "a_tile": lambda: noise("RGB", IDEFICS3_TILE_SIZE, IDEFICS3_TILE_SIZE, seed=8),
    "square": lambda: noise("RGB", 256, 256, seed=9),
    "large": lambda: noise("RGB", 1500, 1000, seed=10),
    "thin_strip": lambda: noise("RGB", 1000, 5, seed=11),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_idefics3(tmp_path_factory.mktemp("idefics3"))


@pytest.fixture(scope="module")
def hf_processor(folder: Path) -> transformers.ProcessorMixin:
    return pil_processor(folder)


def test_from_folder_reads_transformers_5_layout(folder: Path) -> None:
    processor = Idefics3ImageProcessor.from_folder(folder)
    assert (processor.image_seq_len, processor.tile_size, processor.longest_edge) == (16, 64, 256)
    assert processor.resample == PIL.Image.Resampling.LANCZOS and processor.do_image_splitting
    assert processor.image_token == "<image>"


def test_from_folder_reads_hub_layout(tmp_path: Path) -> None:
    """SmolVLM's folders on the Hub: preprocessor_config.json holds the image settings;
    with no image_seq_len in processor_config.json it comes from the model's config."""
    settings = {"size": {"longest_edge": 1536}, "max_image_size": {"longest_edge": 384}}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**settings, "resample": 1}))
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_seq_len": 64}))
    processor = Idefics3ImageProcessor.from_folder(tmp_path)
    assert (processor.longest_edge, processor.tile_size, processor.image_seq_len) == (1536, 384, 64)
    (tmp_path / "processor_config.json").unlink()
    vision = {"image_size": 512, "patch_size": 16}
    (tmp_path / "config.json").write_text(json.dumps({"vision_config": vision, "scale_factor": 4}))
    assert Idefics3ImageProcessor.from_folder(tmp_path).image_seq_len == 64


@pytest.mark.parametrize("splitting", [True, False], ids=["split", "whole"])
@pytest.mark.parametrize("name", sorted(IMAGES))
def test_matches_transformers(
    name: str, splitting: bool, folder: Path, hf_processor: transformers.ProcessorMixin
) -> None:
    image = IMAGES[name]()
    ours = dataclasses.replace(
        Idefics3ImageProcessor.from_folder(folder), do_image_splitting=splitting
    )
    processed = ours.process(image)
    expected = hf_processor(
        text=PROMPT, images=[image], do_image_splitting=splitting, return_tensors="pt"
    )
    # [1 prompt, tiles, 3, 64, 64]; one image's tiles are all full size, never padding
    assert expected["pixel_attention_mask"].all()
    pixel_values = expected["pixel_values"][0]
    assert processed.pixel_values.dtype == torch.float32
    assert processed.pixel_values.shape == pixel_values.shape
    assert torch.equal(processed.pixel_values, pixel_values)
    num_tiles = processed.rows * processed.cols + 1 if processed.rows else 1
    assert processed.pixel_values.shape[0] == num_tiles

    text = PROMPT.replace(ours.image_token, ours.placeholder_text(processed.rows, processed.cols))
    input_ids = hf_processor.tokenizer(text, return_tensors="pt").input_ids
    assert torch.equal(input_ids, expected["input_ids"])
    image_token_id = hf_processor.tokenizer.convert_tokens_to_ids(ours.image_token)
    assert (input_ids == image_token_id).sum() == num_tiles * ours.image_seq_len


def test_without_the_cpu_kernels_pil_and_numpy_give_the_same_pixels(folder, monkeypatch):
    """cpu_kernels off (the engine's setting): no kernel runs, and nothing changes."""
    image = IMAGES["landscape"]()
    with_kernels = Idefics3ImageProcessor.from_folder(folder).process(image)

    def refused(*args):
        raise AssertionError("a CPU kernel ran with cpu_kernels off")

    monkeypatch.setattr(pixels, "resize_like_pillow", refused)
    monkeypatch.setattr(pixels, "pixel_levels", refused)
    ours = dataclasses.replace(Idefics3ImageProcessor.from_folder(folder), cpu_kernels=False)
    assert torch.equal(ours.process(image).pixel_values, with_kernels.pixel_values)


def test_splitting_grid() -> None:
    """A 300 x 170 image: 256 x 146 after the first resize, then 256 x 192 (4 columns and
    3 rows of 64-pixel tiles), then the global image; the tags name each tile."""
    processor = Idefics3ImageProcessor(image_seq_len=2, longest_edge=256, tile_size=64)
    processed = processor.process(IMAGES["landscape"]())
    assert (processed.rows, processed.cols) == (3, 4)
    assert processed.pixel_values.shape == (13, 3, 64, 64)
    text = processor.placeholder_text(1, 2)
    tile = "<fake_token_around_image><row_1_col_{}><image><image>"
    fenced_global = "<fake_token_around_image><global-img><image><image><fake_token_around_image>"
    assert text == tile.format(1) + tile.format(2) + "\n\n" + fenced_global
    assert processor.placeholder_text(0, 0) == fenced_global


@pytest.mark.parametrize("name", ["landscape", "large", "one_by_three"])
def test_overrides_are_the_processors_keyword_arguments(
    name: str, folder: Path, hf_processor: transformers.ProcessorMixin
) -> None:
    """mm_processor_kwargs over the folder's settings, as vLLM passes them to the
    processor's call: a longest edge of 3 tiles instead of 4, without splitting."""
    overrides = {"size": {"longest_edge": 3 * IDEFICS3_TILE_SIZE}, "do_image_splitting": False}
    ours = Idefics3ImageProcessor.from_folder(folder, overrides)
    assert (ours.longest_edge, ours.do_image_splitting) == (3 * IDEFICS3_TILE_SIZE, False)
    processed = ours.process(IMAGES[name]())
    expected = hf_processor(text=PROMPT, images=[IMAGES[name]()], return_tensors="pt", **overrides)
    assert torch.equal(processed.pixel_values, expected["pixel_values"][0])
    with_splitting = {**overrides, "do_image_splitting": True}
    ours = Idefics3ImageProcessor.from_folder(folder, with_splitting)
    expected = hf_processor(
        text=PROMPT, images=[IMAGES[name]()], return_tensors="pt", **with_splitting
    )
    assert torch.equal(ours.process(IMAGES[name]()).pixel_values, expected["pixel_values"][0])
