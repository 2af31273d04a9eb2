"""engine/multimodal/gemma3_images.py: one image's pixel values equal transformers' Gemma 3
image processor's to the bit (the PIL backend, which AutoImageProcessor gives without
torchvision, and Gemma3Processor's), for images of every shape and mode, at Gemma 3's 896
x 896 and a small size; the prompt text for an image is Gemma3Processor's; pan-and-scan
is refused."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch
import transformers
from hetero_infer.engine.multimodal.gemma3_images import Gemma3ImageProcessor
from hetero_infer.engine.settings.exceptions import ConfigError

from tests.engine.multimodal.test_idefics3_images import noise, palette_with_transparency
from tests.helpers import make_byte_fallback_tokenizer
from tests.tiny_models import pil_image_processor, pil_processor

PROMPT = "user: What is in <start_of_image> this picture?\nassistant:"
IMAGE_SEQ_LENGTH = 7


def png_round_trip(image: PIL.Image.Image) -> PIL.Image.Image:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    buffer.seek(0)
    return PIL.Image.open(buffer)


def transparent_png() -> PIL.Image.Image:
    """An RGBA PNG read back from its file: a see-through band and a half-transparent one."""
    image = noise("RGBA", 60, 40, seed=12)
    pixels = np.array(image)
    pixels[:10, :, 3] = 0
    pixels[10:20, :, 3] = 128
    return png_round_trip(PIL.Image.fromarray(pixels))


def rgb_png_with_transparent_colour() -> PIL.Image.Image:
    """An RGB PNG whose tRNS chunk makes one colour see-through (info["transparency"])."""
    pixels = np.array(noise("RGB", 40, 30, seed=13))
    pixels[5:15, 5:25] = (10, 20, 30)
    image = PIL.Image.fromarray(pixels)
    image.info["transparency"] = (10, 20, 30)
    return png_round_trip(image)


def sixteen_bit() -> PIL.Image.Image:
    pixels = np.random.default_rng(14).integers(0, 65536, size=(37, 53), dtype=np.uint16)
    image = PIL.Image.fromarray(pixels)
    assert image.mode == "I;16"
    return image


def cmyk() -> PIL.Image.Image:
    pixels = np.random.default_rng(15).integers(0, 256, size=(41, 29, 4), dtype=np.uint8)
    return PIL.Image.frombytes("CMYK", (29, 41), pixels.tobytes())


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
    "one_by_three": lambda: noise("RGB", 1, 3, seed=7),
    "exactly_896": lambda: noise("RGB", 896, 896, seed=8),
    "exactly_32": lambda: noise("RGB", 32, 32, seed=17),
    "large": lambda: noise("RGB", 1500, 1000, seed=10),
    "thin_strip": lambda: noise("RGB", 1000, 5, seed=11),
}


def gemma3_tokenizer(
    boi: str = "<start_of_image>", image: str = "<image_soft_token>", eoi: str = "<end_of_image>"
) -> transformers.PreTrainedTokenizerFast:
    """The test byte-fallback tokenizer with Gemma 3's image tokens, named as Gemma's
    tokenizer names them (boi_token, image_token, eoi_token)."""
    base = make_byte_fallback_tokenizer()
    base.add_special_tokens({"additional_special_tokens": [boi, eoi, image]})
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer,
        bos_token=base.bos_token,
        eos_token=base.eos_token,
        unk_token=base.unk_token,
        boi_token=boi,
        image_token=image,
        eoi_token=eoi,
    )


def save_processor(folder: Path, size: int, **tokens: str) -> Path:
    """A Gemma3Processor as transformers 5 saves it: the image settings under
    "image_processor" in processor_config.json."""
    image_processor = transformers.Gemma3ImageProcessorPil(size={"height": size, "width": size})
    processor = transformers.Gemma3Processor(
        image_processor=image_processor,
        tokenizer=gemma3_tokenizer(**tokens),
        image_seq_length=IMAGE_SEQ_LENGTH,
    )
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=[896, 32], ids=["896", "32"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_processor(tmp_path_factory.mktemp("gemma3"), request.param)


@pytest.fixture(scope="module")
def hf_image_processor(folder: Path) -> transformers.BaseImageProcessor:
    image_processor = pil_image_processor(folder)
    # The one this venv has (no torchvision); ours must match it either way.
    assert image_processor.backend == "pil"
    return image_processor


@pytest.fixture(scope="module")
def hf_processor(folder: Path) -> transformers.ProcessorMixin:
    processor = pil_processor(folder)
    assert isinstance(processor, transformers.Gemma3Processor)
    return processor


def test_from_folder_reads_transformers_5_layout(folder: Path) -> None:
    processor = Gemma3ImageProcessor.from_folder(folder)
    size = json.loads((folder / "processor_config.json").read_text())["image_processor"]["size"]
    assert (processor.height, processor.width) == (size["height"], size["width"])
    assert processor.image_seq_length == IMAGE_SEQ_LENGTH
    assert processor.resample == PIL.Image.Resampling.BILINEAR and processor.do_convert_rgb
    assert (processor.marker, processor.image_token) == ("<start_of_image>", "<image_soft_token>")


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_matches_transformers(
    name: str,
    folder: Path,
    hf_image_processor: transformers.BaseImageProcessor,
    hf_processor: transformers.ProcessorMixin,
) -> None:
    ours = Gemma3ImageProcessor.from_folder(folder)
    processed = ours.process(IMAGES[name]())
    assert (processed.rows, processed.cols) == (0, 0)
    assert processed.pixel_values.dtype == torch.float32
    assert processed.pixel_values.shape == (1, 3, ours.height, ours.width)

    expected = hf_image_processor(IMAGES[name](), return_tensors="pt")["pixel_values"]
    assert torch.equal(processed.pixel_values, expected)

    expected = hf_processor(text=PROMPT, images=[IMAGES[name]()], return_tensors="pt")
    assert torch.equal(processed.pixel_values, expected["pixel_values"])
    text = PROMPT.replace(ours.marker, "".join(ours.placeholder_parts()))
    input_ids = hf_processor.tokenizer(text, return_tensors="pt").input_ids
    assert torch.equal(input_ids, expected["input_ids"])
    image_token_id = hf_processor.tokenizer.convert_tokens_to_ids(ours.image_token)
    assert (input_ids == image_token_id).sum() == IMAGE_SEQ_LENGTH


def test_placeholder_parts(tmp_path: Path) -> None:
    """Gemma3Processor's full_image_sequence, the tokens' strings the tokenizer's."""
    ours = Gemma3ImageProcessor(image_seq_length=3)
    core = "<start_of_image>" + "<image_soft_token>" * 3 + "<end_of_image>"
    assert ours.placeholder_parts() == ("\n\n", core, "\n\n")
    assert ours.placeholder_parts(0, 0) == ours.placeholder_parts()
    for rows, cols in ((1, 2), (1, 0), (0, 2)):
        with pytest.raises(ValueError, match="one tile"):
            ours.placeholder_parts(rows, cols)
    tokens = {"boi": "<boi>", "image": "<img>", "eoi": "<eoi>"}
    folder = save_processor(tmp_path, 32, **tokens)
    ours = Gemma3ImageProcessor.from_folder(folder)
    assert (ours.marker, ours.image_token, ours.eoi_token) == ("<boi>", "<img>", "<eoi>")
    hf_processor = pil_processor(folder)
    assert "".join(ours.placeholder_parts()) == hf_processor.full_image_sequence
    assert ours.placeholder_parts()[1] == "<boi>" + "<img>" * IMAGE_SEQ_LENGTH + "<eoi>"


def write_hub_layout(folder: Path, source: Path, **settings: object) -> None:
    """The Hub's Gemma 3 folders: preprocessor_config.json with nulls for the processor's
    defaults, processor_config.json with image_seq_length alone."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    hub = {
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_pan_and_scan": None,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Gemma3ImageProcessor",
        "image_seq_length": 256,
        "image_std": [0.5, 0.5, 0.5],
        "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None,
        "pan_and_scan_min_ratio_to_activate": None,
        "processor_class": "Gemma3Processor",
        "resample": 2,
        "rescale_factor": 0.00392156862745098,
        "size": {"height": 32, "width": 32},
    }
    (folder / "preprocessor_config.json").write_text(json.dumps({**hub, **settings}))
    processor_config = {"image_seq_length": 5, "processor_class": "Gemma3Processor"}
    (folder / "processor_config.json").write_text(json.dumps(processor_config))


def test_from_folder_reads_hub_layout(tmp_path: Path) -> None:
    """A null do_convert_rgb is Gemma3Processor's True: an RGBA image is made RGB, as the
    processor makes it. Without image_seq_length in processor_config.json it is the
    model's mm_tokens_per_image."""
    source = save_processor(tmp_path / "source", 32)
    folder = tmp_path / "hub"
    folder.mkdir()
    write_hub_layout(folder, source)
    ours = Gemma3ImageProcessor.from_folder(folder)
    assert (ours.height, ours.width, ours.image_seq_length) == (32, 32, 5)
    assert ours.do_convert_rgb and ours.resample == PIL.Image.Resampling.BILINEAR
    hf_processor = pil_processor(folder)
    expected = hf_processor(text=PROMPT, images=[IMAGES["rgba"]()], return_tensors="pt")
    assert torch.equal(ours.process(IMAGES["rgba"]()).pixel_values, expected["pixel_values"])
    assert "".join(ours.placeholder_parts()) == hf_processor.full_image_sequence

    (folder / "processor_config.json").unlink()
    (folder / "config.json").write_text(json.dumps({"mm_tokens_per_image": 64}))
    assert Gemma3ImageProcessor.from_folder(folder).image_seq_length == 64
    (folder / "config.json").unlink()
    assert Gemma3ImageProcessor.from_folder(folder).image_seq_length == 256


def test_pan_and_scan_refused(tmp_path: Path) -> None:
    source = save_processor(tmp_path / "source", 32)
    folder = tmp_path / "hub"
    folder.mkdir()
    write_hub_layout(folder, source, do_pan_and_scan=True)
    with pytest.raises(ConfigError, match="pan-and-scan is not supported"):
        Gemma3ImageProcessor.from_folder(folder)


def test_size_must_be_height_and_width(tmp_path: Path) -> None:
    source = save_processor(tmp_path / "source", 32)
    folder = tmp_path / "hub"
    folder.mkdir()
    write_hub_layout(folder, source, size={"shortest_edge": 32})
    with pytest.raises(ConfigError, match="height and width"):
        Gemma3ImageProcessor.from_folder(folder)


def test_settings_a_folder_leaves_out_are_transformers_defaults(tmp_path: Path) -> None:
    """The processor's own defaults (224 x 224, resized, rescaled, normalized by 0.5s) stand
    for each value setting the folder leaves out, as in transformers."""
    source = save_processor(tmp_path / "source", 32)
    folder = tmp_path / "hub"
    folder.mkdir()
    write_hub_layout(folder, source)
    settings = json.loads((folder / "preprocessor_config.json").read_text())
    left_out = ("size", "do_resize", "do_rescale", "do_normalize", "rescale_factor", "resample")
    left_out += ("image_mean", "image_std")
    kept = {key: value for key, value in settings.items() if key not in left_out}
    (folder / "preprocessor_config.json").write_text(json.dumps(kept))
    ours = Gemma3ImageProcessor.from_folder(folder)
    assert (ours.height, ours.width) == (224, 224)
    image = IMAGES["landscape"]
    expected = pil_processor(folder)(text=PROMPT, images=[image()], return_tensors="pt")
    assert torch.equal(ours.process(image()).pixel_values, expected["pixel_values"])


def test_mean_and_std_need_three_values(tmp_path: Path) -> None:
    source = save_processor(tmp_path / "source", 32)
    folder = tmp_path / "hub"
    folder.mkdir()
    write_hub_layout(folder, source, image_mean=[0.5, 0.5])
    with pytest.raises(ConfigError, match="image_mean and image_std need 3 values"):
        Gemma3ImageProcessor.from_folder(folder)


@pytest.mark.parametrize(
    ("settings", "processor_config"),
    [({"size": {"height": 0, "width": 32}}, {}), ({"size": {"height": 32, "width": 0}}, {}),
     ({}, {"image_seq_length": 0})],
    ids=["no height", "no width", "no image tokens"],
)  # fmt: skip
def test_sizes_and_image_tokens_must_be_positive(tmp_path: Path, settings, processor_config):
    source = save_processor(tmp_path / "source", 32)
    folder = tmp_path / "hub"
    folder.mkdir()
    write_hub_layout(folder, source, **settings)
    if processor_config:
        (folder / "processor_config.json").write_text(json.dumps(processor_config))
    with pytest.raises(ConfigError, match="must be > 0"):
        Gemma3ImageProcessor.from_folder(folder)


@pytest.mark.parametrize(
    ("tokenizer_config", "boi"),
    [
        ({"boi_token": {"content": "<b>", "special": True}}, "<b>"),  # AddedToken's
        ({"extra_special_tokens": {"boi_token": "<a>"}}, "<a>"),
        ({"extra_special_tokens": {"boi_token": "<a>"}, "boi_token": "<b>"}, "<b>"),
        ({"boi_token": "<b>", "model_specific_special_tokens": {"boi_token": "<c>"}}, "<c>"),
        ({"extra_special_tokens": ["<x>"]}, "<start_of_image>"),  # a list names none
    ],
)
def test_the_special_tokens_as_the_tokenizer_config_names_them(
    tmp_path: Path, tokenizer_config: dict, boi: str
) -> None:
    source = save_processor(tmp_path / "source", 32)
    folder = tmp_path / "hub"
    folder.mkdir()
    write_hub_layout(folder, source)
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert Gemma3ImageProcessor.from_folder(folder).marker == boi


def test_sizes_and_image_tokens_of_one_are_taken() -> None:
    ours = Gemma3ImageProcessor(image_seq_length=1, height=1, width=1)
    assert ours.process(IMAGES["landscape"]()).pixel_values.shape == (1, 3, 1, 1)
