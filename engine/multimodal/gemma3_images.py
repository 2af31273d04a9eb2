"""Gemma 3's image processing for one image, as transformers' PIL-based Gemma 3 image
processor (Gemma3ImageProcessorPil, what AutoImageProcessor gives where torchvision is not
installed) does it, to the bit: the image made RGB (transparent parts white), squeezed to
``height`` x ``width`` (896 x 896 in every Gemma 3) by PIL's resize of the 8-bit image
with the configured filter (BILINEAR), rescaled in float64 and rounded to float32, then
normalized in float32. Bit-exactness matters because the vision tower's output, and so
the text the model writes about the image, must be transformers' for the same picture.

And the prompt text that stands for the image where its ``<start_of_image>`` marker was,
as transformers' Gemma3Processor expands it: the marker itself again, ``image_seq_length``
image tokens (one per embedding the vision tower and its pooling give), the end-of-image
token, fenced by blank lines.

Pan-and-scan (extra crops of a very wide or tall image, each with its own image tokens
and other text around them) is not supported: a folder that turns it on is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import PIL.Image
import torch
from hetero_infer.engine.multimodal.pixels import (
    VALUE_SETTINGS,
    ProcessedImage,
    check_mean_and_std,
    normalized,
    pixel_settings,
    pixels_of,
    read_json,
    resized,
    to_rgb,
    to_tensor,
)
from hetero_infer.engine.settings.exceptions import ConfigError

BOI_TOKEN = "<start_of_image>"
IMAGE_TOKEN = "<image_soft_token>"
EOI_TOKEN = "<end_of_image>"
# Gemma3Processor's default where neither processor_config.json nor config.json says.
DEFAULT_IMAGE_SEQ_LENGTH = 256
# Around the image's tokens, as Gemma3Processor's full_image_sequence has it.
IMAGE_FENCE = "\n\n"


@dataclass(frozen=True)
class Gemma3ImageProcessor:
    """The image processor's settings (transformers' names and defaults, which stand
    where a config leaves a key out or sets it to null), the image tokens per image and
    the special tokens' strings (the tokenizer's boi_token, image_token and eoi_token)."""

    # What mm_processor_kwargs may set over the folder's (ImagePrompts.for_model).
    OVERRIDABLE: ClassVar[frozenset[str]] = VALUE_SETTINGS | {"do_pan_and_scan"}

    image_seq_length: int = DEFAULT_IMAGE_SEQ_LENGTH
    # size["height"] and size["width"]; transformers' class default is 224 x 224, every
    # Gemma 3 folder says 896 x 896.
    height: int = 224
    width: int = 224
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True
    resample: PIL.Image.Resampling = PIL.Image.Resampling.BILINEAR
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # Whether the CPU kernels resize and look up the pixels (the engine's cpu_kernels;
    # the same values either way).
    cpu_kernels: bool = True
    boi_token: str = BOI_TOKEN
    image_token: str = IMAGE_TOKEN
    eoi_token: str = EOI_TOKEN

    def __post_init__(self) -> None:
        if self.image_seq_length <= 0 or self.height <= 0 or self.width <= 0:
            raise ConfigError(
                f"Gemma 3 image processor: image_seq_length ({self.image_seq_length}) and "
                f"size ({self.height} x {self.width}) must be > 0"
            )
        check_mean_and_std("Gemma 3", self.image_mean, self.image_std)

    @classmethod
    def from_folder(
        cls, path: Path, overrides: Mapping[str, Any] | None = None
    ) -> Gemma3ImageProcessor:
        """From a model folder: the image processor's settings in preprocessor_config.json
        (the Hub's Gemma 3 folders, with nulls for the processor's defaults) or under
        "image_processor" in processor_config.json (transformers 5 saves them there);
        image_seq_length from processor_config.json or else config.json's
        mm_tokens_per_image; the special tokens from tokenizer_config.json. ``overrides``
        (mm_processor_kwargs) go over the files' settings, as keyword arguments to
        transformers' from_pretrained do."""
        settings = read_json(path / "preprocessor_config.json")
        processor = read_json(path / "processor_config.json")
        settings.update(processor.get("image_processor", {}))
        settings.update(overrides or {})
        # A null is the processor's default (Gemma3Processor's images_kwargs), as for a
        # key left out.
        settings = {key: value for key, value in settings.items() if value is not None}
        if settings.get("do_pan_and_scan"):
            raise ConfigError(
                f"{path}: the image processor's do_pan_and_scan is on; Gemma 3's "
                "pan-and-scan is not supported"
            )
        defaults = cls()
        size = settings.get("size", {"height": defaults.height, "width": defaults.width})
        if set(size) != {"height", "width"}:
            raise ConfigError(
                f"{path}: image processor size {size} is not a height and width, as Gemma 3's is"
            )
        image_seq_length = processor.get("image_seq_length")
        if image_seq_length is None:
            config = read_json(path / "config.json")
            image_seq_length = config.get("mm_tokens_per_image", DEFAULT_IMAGE_SEQ_LENGTH)
        tokens = _special_tokens(read_json(path / "tokenizer_config.json"))
        return cls(
            image_seq_length=int(image_seq_length),
            height=int(size["height"]),
            width=int(size["width"]),
            **pixel_settings(settings, defaults),
            boi_token=tokens.get("boi_token", defaults.boi_token),
            image_token=tokens.get("image_token", defaults.image_token),
            eoi_token=tokens.get("eoi_token", defaults.eoi_token),
        )

    @property
    def largest_pixels(self) -> int:
        """The pixels every image is resized to."""
        return self.height * self.width

    @property
    def marker(self) -> str:
        """The token the chat template writes where each image goes."""
        return self.boi_token

    def process(self, image: PIL.Image.Image) -> ProcessedImage:
        """The image as the vision tower takes it: pixel_values [1, 3, height, width]."""
        return self.process_rgb(pixels_of(self.to_rgb(image)))

    def process_rgb(self, pixels: torch.Tensor) -> ProcessedImage:
        """process() of an image to_rgb() has made, as its pixels (pixels_of)."""
        if self.do_resize:
            pixels = resized(pixels, self.height, self.width, self.resample, self.cpu_kernels)
        pixel_values = normalized(to_tensor(pixels)[None], self)
        return ProcessedImage(pixel_values, rows=0, cols=0)

    def placeholder_parts(self, rows: int = 0, cols: int = 0) -> tuple[str, str, str]:
        """The text that replaces one marker, in three parts: the text before the first
        special token, the special tokens (the marker, the image tokens, the end-of-image
        token) and the text after the last. Joined, they are Gemma3Processor's
        full_image_sequence. ``rows`` and ``cols`` (ProcessedImage's, always 0: one image
        is one tile) are taken for the same call as Idefics3's."""
        if rows or cols:
            raise ValueError(f"a Gemma 3 image is one tile, not {rows} x {cols}")
        core = f"{self.boi_token}{self.image_token * self.image_seq_length}{self.eoi_token}"
        return IMAGE_FENCE, core, IMAGE_FENCE

    def to_rgb(self, image: PIL.Image.Image) -> PIL.Image.Image:
        """The image in RGB, as the processor first makes it."""
        return to_rgb(image, self.do_convert_rgb)


def _special_tokens(tokenizer_config: dict[str, Any]) -> dict[str, str]:
    """boi_token, image_token and eoi_token as the tokenizer has them: top-level keys of
    tokenizer_config.json (the Hub's Gemma 3 folders, transformers 5's save) or a dict of
    named extra special tokens; a token may be an AddedToken's dict. Later sources win,
    in the order transformers' tokenizer sets them."""
    found: dict[str, str] = {}
    for source in (
        tokenizer_config.get("extra_special_tokens"),
        tokenizer_config,
        tokenizer_config.get("model_specific_special_tokens"),
    ):
        if not isinstance(source, dict):
            continue
        for key in ("boi_token", "image_token", "eoi_token"):
            value = source.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                found[key] = value
    return found
