"""engine/multimodal/qwen2_vl_images.py: one image's pixel values (flattened) and patch grid
equal transformers' Qwen2-VL image processor's to the bit (the PIL backend, which
AutoImageProcessor gives without torchvision), for images of every shape and mode, with
the default settings and small ones; the prompt text for an image is Qwen2_5_VLProcessor's;
the settings' names and precedence are transformers'; an aspect ratio over 200 is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch
import transformers
from hetero_infer.engine.multimodal.qwen2_vl_images import Qwen2VLImageProcessor, smart_resize
from hetero_infer.engine.settings.exceptions import ConfigError
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
    smart_resize as transformers_smart_resize,
)

from tests.engine.multimodal.test_gemma3_images import (
    cmyk,
    rgb_png_with_transparent_colour,
    sixteen_bit,
    transparent_png,
)
from tests.engine.multimodal.test_idefics3_images import noise, palette_with_transparency
from tests.helpers import make_byte_fallback_tokenizer
from tests.tiny_models import pil_image_processor, qwen2_5_vl_processor

IMAGE_PROMPT = "<|vision_start|><|image_pad|><|vision_end|>"
PROMPT = f"user: {IMAGE_PROMPT}What is in this picture?\nassistant:"
SMALL = {"patch_size": 4, "merge_size": 2, "min_pixels": 16 * 16, "max_pixels": 64 * 64}

# Built on call: a test may not share an image whose state another test's processing changed.
IMAGES = {
    "landscape": lambda: noise("RGB", 300, 170),
    "portrait": lambda: noise("RGB", 90, 400, seed=1),
    "rgba": lambda: noise("RGBA", 123, 77, seed=2),
    "greyscale": lambda: noise("L", 50, 61, seed=4),
    "greyscale_alpha": lambda: noise("LA", 33, 20, seed=5),
    "palette_transparent": palette_with_transparency,
    "palette": lambda: noise("RGB", 64, 48, seed=16).quantize(colors=32),
    "transparent_png": transparent_png,
    "rgb_png_transparent_colour": rgb_png_with_transparent_colour,
    "sixteen_bit": sixteen_bit,
    "cmyk": cmyk,
    "one_pixel": lambda: noise("RGB", 1, 1, seed=6),
    "tiny": lambda: noise("RGB", 3, 5, seed=7),
    "exactly_56": lambda: noise("RGB", 56, 56, seed=8),
    "exactly_64": lambda: noise("RGB", 64, 64, seed=17),
    "large": lambda: noise("RGB", 1500, 1000, seed=10),
    "strip_at_limit": lambda: noise("RGB", 1000, 5, seed=11),
    "tall_strip": lambda: noise("RGB", 7, 1390, seed=18),
}


def qwen_tokenizer(image_token: str | None = None) -> transformers.PreTrainedTokenizerFast:
    """The test byte-fallback tokenizer with Qwen's vision tokens; ``image_token`` names the
    tokenizer's image_token (Qwen's own tokenizer names none)."""
    base = make_byte_fallback_tokenizer()
    image = image_token or "<|image_pad|>"
    tokens = ["<|vision_start|>", image, "<|vision_end|>", "<|video_pad|>"]
    base.add_special_tokens({"additional_special_tokens": tokens})
    named = {"image_token": image_token} if image_token else {}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer,
        bos_token=base.bos_token,
        eos_token=base.eos_token,
        unk_token=base.unk_token,
        **named,
    )


def save_processor(folder: Path, image_token: str | None = None, **settings: int) -> Path:
    """The image processor (its PIL class) and the tokenizer as transformers saves them."""
    folder.mkdir(parents=True, exist_ok=True)
    transformers.Qwen2VLImageProcessorPil(**settings).save_pretrained(folder)
    qwen_tokenizer(image_token).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["default", "small"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    settings = SMALL if request.param == "small" else {}
    return save_processor(tmp_path_factory.mktemp("qwen2_vl"), **settings)


@pytest.fixture(scope="module")
def hf_image_processor(folder: Path) -> transformers.BaseImageProcessor:
    image_processor = pil_image_processor(folder)
    # The one this venv has (no torchvision); ours must match it either way.
    assert image_processor.backend == "pil"
    return image_processor


@pytest.fixture(scope="module")
def hf_processor(folder: Path) -> transformers.Qwen2_5_VLProcessor:
    return qwen2_5_vl_processor(folder)


def test_from_folder_reads_saved_settings(folder: Path) -> None:
    ours = Qwen2VLImageProcessor.from_folder(folder)
    saved = json.loads((folder / "preprocessor_config.json").read_text())
    assert (ours.min_pixels, ours.max_pixels) == (
        saved["size"]["shortest_edge"],
        saved["size"]["longest_edge"],
    )
    assert (ours.patch_size, ours.merge_size) == (saved["patch_size"], saved["merge_size"])
    assert ours.temporal_patch_size == 2 and ours.do_convert_rgb
    assert ours.resample == PIL.Image.Resampling.BICUBIC
    assert (ours.marker, ours.image_token) == ("<|image_pad|>", "<|image_pad|>")


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_matches_transformers(
    name: str,
    folder: Path,
    hf_image_processor: transformers.BaseImageProcessor,
    hf_processor: transformers.Qwen2_5_VLProcessor,
) -> None:
    ours = Qwen2VLImageProcessor.from_folder(folder)
    processed = ours.process(IMAGES[name]())
    dim = 3 * ours.temporal_patch_size * ours.patch_size**2
    grid = (processed.rows, processed.cols)
    assert processed.pixel_values.dtype == torch.float32
    assert processed.pixel_values.shape == (*grid, dim)
    flat = processed.pixel_values.reshape(-1, dim)

    expected = hf_image_processor(IMAGES[name](), return_tensors="pt")
    assert expected["image_grid_thw"].tolist() == [[1, *grid]]
    assert torch.equal(flat, expected["pixel_values"])

    expected = hf_processor(text=PROMPT, images=[IMAGES[name]()], return_tensors="pt")
    assert torch.equal(flat, expected["pixel_values"])
    text = PROMPT.replace(ours.marker, "".join(ours.placeholder_parts(*grid)))
    input_ids = hf_processor.tokenizer(text, return_tensors="pt").input_ids
    assert torch.equal(input_ids, expected["input_ids"])
    image_token_id = hf_processor.tokenizer.convert_tokens_to_ids(ours.image_token)
    merged = (grid[0] // ours.merge_size) * (grid[1] // ours.merge_size)
    assert (input_ids == image_token_id).sum() == merged


def test_patch_order() -> None:
    """The rows are by merge_size x merge_size block, each block's patches row by row; a
    row is its patch repeated temporal_patch_size times, channel by channel. (The image's
    size is kept by the resize, and its values by turning rescaling and normalizing off.)"""
    ours = Qwen2VLImageProcessor(
        patch_size=4,
        merge_size=2,
        min_pixels=256,
        max_pixels=4096,
        do_rescale=False,
        do_normalize=False,
    )
    image = noise("RGB", 32, 16, seed=19)
    processed = ours.process(image)
    assert (processed.rows, processed.cols) == (4, 8)
    pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float()
    flat = processed.pixel_values.reshape(-1, 3, 2, 4, 4)
    # (row, column) of each of the first rows' patch: block (0, 0), then block (0, 1).
    for index, (row, col) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3)]):
        patch = pixels[:, row * 4 : row * 4 + 4, col * 4 : col * 4 + 4]
        assert torch.equal(flat[index, :, 0], patch) and torch.equal(flat[index, :, 1], patch)
    # The second block row starts after the first's 4 blocks of 4 patches.
    assert torch.equal(flat[16, :, 0], pixels[:, 8:12, 0:4])


def test_placeholder_parts_and_image_token(tmp_path: Path) -> None:
    ours = Qwen2VLImageProcessor()
    assert ours.placeholder_parts(4, 6) == ("", "<|image_pad|>" * 6, "")
    for rows, cols in ((3, 4), (4, 3), (0, 4), (4, 0), (-2, -2)):
        with pytest.raises(ValueError, match="blocks"):
            ours.placeholder_parts(rows, cols)
    one_patch_blocks = Qwen2VLImageProcessor(merge_size=1)
    assert one_patch_blocks.placeholder_parts(1, 1) == ("", "<|image_pad|>", "")
    folder = save_processor(tmp_path, image_token="<|img|>", **SMALL)
    ours = Qwen2VLImageProcessor.from_folder(folder)
    assert (ours.marker, ours.image_token) == ("<|img|>", "<|img|>")
    hf_processor = qwen2_5_vl_processor(folder)
    assert hf_processor.image_token == "<|img|>"
    prompt = PROMPT.replace("<|image_pad|>", "<|img|>")
    processed = ours.process(IMAGES["landscape"]())
    expected = hf_processor(text=prompt, images=[IMAGES["landscape"]()], return_tensors="pt")
    text = prompt.replace(
        ours.marker, "".join(ours.placeholder_parts(processed.rows, processed.cols))
    )
    assert torch.equal(
        hf_processor.tokenizer(text, return_tensors="pt").input_ids, expected["input_ids"]
    )


def hub_layout(folder: Path, source: Path, name: str, **settings: object) -> Path:
    """A folder with the given image settings in ``name`` (preprocessor_config.json as the
    Hub's Qwen folders, or processor_config.json's "image_processor" as transformers 5)."""
    folder.mkdir()
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / file, folder / file)
    base = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
    }
    config = {**base, **settings}
    if name == "processor_config.json":
        config = {"image_processor": config, "processor_class": "Qwen2_5_VLProcessor"}
    (folder / name).write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("name", ["preprocessor_config.json", "processor_config.json"])
@pytest.mark.parametrize(
    "settings",
    [
        # The Hub's: min_pixels and max_pixels, no size.
        {"min_pixels": 300, "max_pixels": 3000, "patch_size": 4},
        # min_pixels and max_pixels win over the size's.
        {
            "size": {"shortest_edge": 100, "longest_edge": 90000},
            "min_pixels": 500,
            "max_pixels": 2500,
            "patch_size": 5,
            "resample": 2,
        },
        {"size": {"shortest_edge": 64, "longest_edge": 1000}, "max_pixels": None, "patch_size": 3},
        {"size": None, "max_pixels": 5000, "patch_size": 6, "image_std": 0.5, "image_mean": 0.5},
        # Only the bounds: the patch and merge sizes, mean and std are the defaults.
        {"min_pixels": 300, "max_pixels": 6000},
        {},  # every setting the default
        {"merge_size": 1, "temporal_patch_size": 1, "patch_size": 4, "max_pixels": 3000},
    ],
    ids=["hub", "pixels_win", "size", "max_only", "defaults", "none", "ones"],
)
def test_settings_precedence(tmp_path: Path, name: str, settings: dict[str, object]) -> None:
    source = save_processor(tmp_path / "source")
    folder = hub_layout(tmp_path / "layout", source, name, **settings)
    ours = Qwen2VLImageProcessor.from_folder(folder)
    hf = pil_image_processor(folder)
    assert (ours.min_pixels, ours.max_pixels) == (hf.size["shortest_edge"], hf.size["longest_edge"])
    for image in ("landscape", "tall_strip", "tiny", "rgba"):
        processed = ours.process(IMAGES[image]())
        expected = hf(IMAGES[image](), return_tensors="pt")
        assert expected["image_grid_thw"].tolist() == [[1, processed.rows, processed.cols]]
        flat = processed.pixel_values.reshape(processed.rows * processed.cols, -1)
        assert torch.equal(flat, expected["pixel_values"])


def test_nulls_are_defaults(tmp_path: Path) -> None:
    """A null size, min_pixels or max_pixels is the default in transformers too; another
    null (none in the Hub's Qwen folders) is ours, where transformers 5.24 would take None."""
    source = save_processor(tmp_path / "source")
    nulls = {"size": None, "min_pixels": None, "max_pixels": None, "image_mean": None}
    folder = hub_layout(tmp_path / "layout", source, "preprocessor_config.json", **nulls)
    assert Qwen2VLImageProcessor.from_folder(folder) == Qwen2VLImageProcessor()


def test_size_needs_both_edges(tmp_path: Path) -> None:
    source = save_processor(tmp_path / "source")
    folder = hub_layout(
        tmp_path / "layout", source, "preprocessor_config.json", size={"shortest_edge": 64}
    )
    with pytest.raises(ConfigError, match="shortest_edge and a longest_edge"):
        Qwen2VLImageProcessor.from_folder(folder)


@pytest.mark.parametrize("size", [(1001, 5), (3, 700)], ids=["wide", "tall"])
def test_aspect_ratio_over_limit_refused(folder: Path, size: tuple[int, int]) -> None:
    ours = Qwen2VLImageProcessor.from_folder(folder)
    image = noise("RGB", *size, seed=20)
    with pytest.raises(ValueError, match="aspect ratio .* is over 200"):
        ours.process(image)
    with pytest.raises(ValueError, match="aspect ratio must be smaller than 200"):
        pil_image_processor(folder)(image)


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_pixels": 40 * 40},
        {"min_pixels": 90 * 90, "image_mean": 0.25},
        {"size": {"shortest_edge": 500, "longest_edge": 2000}},
    ],
    ids=["max_pixels", "min_pixels", "size"],
)
def test_overrides_go_over_the_folder_as_from_pretrained_takes_them(
    folder: Path, overrides: dict[str, object]
) -> None:
    """mm_processor_kwargs: keyword arguments to from_pretrained, over the saved settings."""
    ours = Qwen2VLImageProcessor.from_folder(folder, overrides)
    hf = transformers.AutoImageProcessor.from_pretrained(folder, use_fast=False, **overrides)
    assert ours != Qwen2VLImageProcessor.from_folder(folder)
    for image in ("landscape", "tall_strip", "large"):
        processed = ours.process(IMAGES[image]())
        expected = hf(IMAGES[image](), return_tensors="pt")
        assert expected["image_grid_thw"].tolist() == [[1, processed.rows, processed.cols]]
        flat = processed.pixel_values.reshape(processed.rows * processed.cols, -1)
        assert torch.equal(flat, expected["pixel_values"])


def test_smart_resize_matches_transformers_at_its_bounds() -> None:
    """Sizes whose rounding lands on max_pixels or min_pixels exactly, and just past them,
    each way round: the area bounds are inclusive as in transformers."""
    factor, min_pixels, max_pixels = 28, 28 * 28 * 2, 28 * 28 * 4
    sizes = [(57, 55), (56, 56), (55, 57), (70, 56), (42, 28), (28, 56), (43, 27), (20, 30)]
    sizes += [(h, w) for h in range(14, 120, 9) for w in range(14, 120, 13)]
    for height, width in sizes:
        ours = smart_resize(height, width, factor, min_pixels, max_pixels)
        assert ours == transformers_smart_resize(height, width, factor, min_pixels, max_pixels), (
            height,
            width,
        )


def test_mean_and_std_need_three_values(tmp_path: Path) -> None:
    source = save_processor(tmp_path / "source")
    for key in ("image_mean", "image_std"):
        folder = hub_layout(tmp_path / key, source, "preprocessor_config.json", **{key: [0.5] * 2})
        with pytest.raises(ConfigError, match="image_mean and image_std need 3 values"):
            Qwen2VLImageProcessor.from_folder(folder)


def test_without_resizing_an_image_must_be_whole_blocks(tmp_path: Path) -> None:
    """do_resize off: an image of whole 2 x 2 blocks of 4-pixel patches goes in at its own
    size, as transformers takes it; one a pixel short of that, wide or tall, is refused."""
    source = save_processor(tmp_path / "source")
    settings = {"do_resize": False, "patch_size": 4}
    folder = hub_layout(tmp_path / "layout", source, "preprocessor_config.json", **settings)
    ours = Qwen2VLImageProcessor.from_folder(folder)
    image = noise("RGB", 40, 24, seed=20)
    processed = ours.process(image)
    assert (processed.rows, processed.cols) == (6, 10)
    expected = pil_image_processor(folder)(image, return_tensors="pt")
    assert torch.equal(processed.pixel_values.reshape(60, -1), expected["pixel_values"])
    for width, height in ((39, 24), (40, 23)):
        with pytest.raises(ValueError, match="not whole blocks"):
            ours.process(noise("RGB", width, height, seed=21))


# (A 0 for min_pixels or max_pixels is refused before, as a size without that edge, as
# transformers refuses it.)
@pytest.mark.parametrize(
    ("setting", "value"),
    [("min_pixels", -1), ("max_pixels", -1), ("patch_size", 0), ("merge_size", 0),
     ("temporal_patch_size", 0)],
)  # fmt: skip
def test_sizes_must_be_positive(tmp_path: Path, setting: str, value: int) -> None:
    source = save_processor(tmp_path / "source")
    settings = {setting: value}
    folder = hub_layout(tmp_path / "layout", source, "preprocessor_config.json", **settings)
    with pytest.raises(ConfigError, match="must be > 0"):
        Qwen2VLImageProcessor.from_folder(folder)


@pytest.mark.parametrize(
    ("tokenizer_config", "token"),
    [
        ({"image_token": {"content": "<|img|>", "special": True}}, "<|img|>"),  # AddedToken's
        ({"extra_special_tokens": {"image_token": "<|a|>"}}, "<|a|>"),
        ({"extra_special_tokens": {"image_token": "<|a|>"}, "image_token": "<|b|>"}, "<|b|>"),
        ({"image_token": "<|b|>", "model_specific_special_tokens": {"image_token": "<|c|>"}},
         "<|c|>"),
        ({"extra_special_tokens": ["<|x|>"]}, "<|image_pad|>"),  # a list names none
    ],
)  # fmt: skip
def test_the_image_token_as_the_tokenizer_config_names_it(
    tmp_path: Path, tokenizer_config: dict, token: str
) -> None:
    source = save_processor(tmp_path / "source")
    folder = hub_layout(tmp_path / "layout", source, "preprocessor_config.json")
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert Qwen2VLImageProcessor.from_folder(folder).image_token == token
