"""Qwen2-VL's and Qwen2.5-VL's image processing for one image, as transformers' PIL-based
Qwen2-VL image processor (Qwen2VLImageProcessorPil, what AutoImageProcessor gives where
torchvision is not installed; both models use it) does it, to the bit: the image made RGB
(transparent parts white), resized by ``smart_resize`` to sides that are multiples of
``patch_size * merge_size`` with between ``min_pixels`` and ``max_pixels`` pixels (aspect
ratio kept as well as that allows; one over 200 is refused) by PIL's resize of the 8-bit
image with the configured filter (BICUBIC), rescaled in float64 and rounded to float32,
normalized in float32 (OpenAI CLIP's mean and std), then cut into patches: the image
repeated to ``temporal_patch_size`` frames (a still image is one temporal patch), each
patch of ``patch_size`` x ``patch_size`` pixels flattened channel-major to
``3 * temporal_patch_size * patch_size**2`` values, the patches ordered by
``merge_size`` x ``merge_size`` block (blocks row by row, and the patches of a block row
by row), the order the vision tower's patch merger takes them in. Bit-exactness matters
because the vision tower's output, and so the text the model writes about the image, must
be transformers' for the same picture.

And the prompt text that stands for the image, as transformers' Qwen2_5_VLProcessor (and
Qwen2VLProcessor) expands it: the chat template writes
``<|vision_start|><|image_pad|><|vision_end|>`` per image and the processor repeats the
image token once per merged patch, ``grid_h * grid_w // merge_size**2`` times.

The settings' names and precedence are transformers 5's: ``size`` is
``{"shortest_edge": min pixels, "longest_edge": max pixels}`` (56 * 56 and 28 * 28 * 1280
by default); a ``min_pixels`` or ``max_pixels`` key (the Hub's Qwen folders write these)
wins over the size's. A null size, min_pixels or max_pixels is the default, as in
transformers; so is any other null here, where transformers 5.24 would take None (off for
a do_ flag, an error for the rest); the Hub's Qwen folders have none.
"""

from __future__ import annotations

import math
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

IMAGE_TOKEN = "<|image_pad|>"
# transformers' OPENAI_CLIP_MEAN and OPENAI_CLIP_STD.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# smart_resize refuses an image whose longer side is more than this many times its shorter.
MAX_ASPECT_RATIO = 200


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """transformers' smart_resize: the size (height, width) an image is resized to, both
    multiples of ``factor``, its area within [min_pixels, max_pixels] where the rounding
    allows, the aspect ratio kept as well as that allows (Python's round: half to even)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"a {width} x {height} image: its aspect ratio "
            f"{max(height, width) / min(height, width):.1f} is over {MAX_ASPECT_RATIO}, the most "
            "Qwen2-VL's image processor takes"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class Qwen2VLImageProcessor:
    """The image processor's settings (transformers' names and defaults, which stand
    where a config leaves a key out or sets it to null) and the image token's string (the
    tokenizer's image_token, else ``<|image_pad|>``)."""

    # What mm_processor_kwargs may set over the folder's (ImagePrompts.for_model).
    OVERRIDABLE: ClassVar[frozenset[str]] = VALUE_SETTINGS | {"size", "min_pixels", "max_pixels"}

    min_pixels: int = 56 * 56  # size["shortest_edge"], or min_pixels
    max_pixels: int = 28 * 28 * 1280  # size["longest_edge"], or max_pixels
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True
    resample: PIL.Image.Resampling = PIL.Image.Resampling.BICUBIC
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    # Whether the CPU kernels resize and look up the pixels (the engine's cpu_kernels;
    # the same values either way).
    cpu_kernels: bool = True
    image_token: str = IMAGE_TOKEN

    def __post_init__(self) -> None:
        sizes = (self.min_pixels, self.max_pixels, self.patch_size, self.merge_size)
        if min(*sizes, self.temporal_patch_size) <= 0:
            raise ConfigError(
                f"Qwen2-VL image processor: min_pixels ({self.min_pixels}), max_pixels "
                f"({self.max_pixels}), patch_size ({self.patch_size}), merge_size "
                f"({self.merge_size}) and temporal_patch_size ({self.temporal_patch_size}) "
                "must be > 0"
            )
        check_mean_and_std("Qwen2-VL", self.image_mean, self.image_std)

    @classmethod
    def from_folder(
        cls, path: Path, overrides: Mapping[str, Any] | None = None
    ) -> Qwen2VLImageProcessor:
        """From a model folder: the image processor's settings in preprocessor_config.json
        (the Hub's Qwen2-VL and Qwen2.5-VL folders) or under "image_processor" in
        processor_config.json (transformers 5 saves them there), nulls standing for the
        defaults; the image token from tokenizer_config.json. ``overrides``
        (mm_processor_kwargs) go over the files' settings, as keyword arguments to
        transformers' from_pretrained do."""
        settings = read_json(path / "preprocessor_config.json")
        settings.update(read_json(path / "processor_config.json").get("image_processor", {}))
        settings.update(overrides or {})
        settings = {key: value for key, value in settings.items() if value is not None}
        defaults = cls()
        # As Qwen2VLImageProcessorPil.__init__: the size (the default where none), then
        # min_pixels and max_pixels over its shortest_edge and longest_edge.
        size = dict(
            settings.get(
                "size", {"shortest_edge": defaults.min_pixels, "longest_edge": defaults.max_pixels}
            )
        )
        for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            if key in settings:
                size[edge] = settings[key]
                size.pop(key, None)
        if not size.get("shortest_edge") or not size.get("longest_edge"):
            raise ConfigError(
                f"{path}: the image processor's size {size} needs a shortest_edge and a "
                "longest_edge (min and max pixels), or min_pixels and max_pixels keys"
            )
        image_token = _image_token(read_json(path / "tokenizer_config.json"))
        return cls(
            min_pixels=int(size["shortest_edge"]),
            max_pixels=int(size["longest_edge"]),
            patch_size=int(settings.get("patch_size", defaults.patch_size)),
            merge_size=int(settings.get("merge_size", defaults.merge_size)),
            temporal_patch_size=int(
                settings.get("temporal_patch_size", defaults.temporal_patch_size)
            ),
            **pixel_settings(settings, defaults),
            image_token=image_token or defaults.image_token,
        )

    @property
    def largest_pixels(self) -> int:
        """About the most pixels an image is resized to (past min_pixels, up)."""
        return max(self.min_pixels, self.max_pixels)

    @property
    def marker(self) -> str:
        """The token the chat template writes where each image goes (between
        ``<|vision_start|>`` and ``<|vision_end|>``), which the processor repeats."""
        return self.image_token

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image of this size is resized to (itself without
        do_resize); ValueError for an aspect ratio over 200."""
        if not self.do_resize:
            return height, width
        factor = self.patch_size * self.merge_size
        return smart_resize(height, width, factor, self.min_pixels, self.max_pixels)

    def process(self, image: PIL.Image.Image) -> ProcessedImage:
        """The image as the vision tower takes it; see process_rgb()."""
        return self.process_rgb(pixels_of(self.to_rgb(image)))

    def process_rgb(self, pixels: torch.Tensor) -> ProcessedImage:
        """process() of an image to_rgb() has made, as its pixels (pixels_of):
        pixel_values [grid_h, grid_w, 3 * temporal_patch_size * patch_size**2] float32,
        rows=grid_h and cols=grid_w (the grid in patches, before merging). The reshape
        only carries the grid: flattened to [grid_h * grid_w, dim], the rows are
        transformers' pixel_values rows in its order (by merge_size x merge_size block),
        so [i, j] is not the patch at row i, column j."""
        height, width = self.resized_size(*pixels.shape[:2])
        if self.do_resize:
            pixels = resized(pixels, height, width, self.resample, self.cpu_kernels)
        values = normalized(to_tensor(pixels)[None], self)[0]
        patch, merge = self.patch_size, self.merge_size
        if height % (patch * merge) or width % (patch * merge):
            raise ValueError(
                f"a {width} x {height} image (do_resize off) is not whole blocks of "
                f"{merge} x {merge} patches of {patch} x {patch} pixels"
            )
        grid_h, grid_w = height // patch, width // patch
        patches = values.reshape(3, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
        # [block row, block column, row in block, column in block, channel, y, x], then the
        # image repeated along a temporal axis after the channel.
        patches = patches.permute(1, 4, 2, 5, 0, 3, 6)[:, :, :, :, :, None]
        patches = patches.expand(*patches.shape[:5], self.temporal_patch_size, patch, patch)
        pixel_values = patches.reshape(grid_h, grid_w, -1).contiguous()
        return ProcessedImage(pixel_values, rows=grid_h, cols=grid_w)

    def placeholder_parts(self, rows: int, cols: int) -> tuple[str, str, str]:
        """The text that replaces one marker, in three parts: the text before the first
        special token (none), the image tokens (one per merged patch: rows * cols //
        merge_size**2, ``rows`` and ``cols`` being ProcessedImage's grid in patches) and
        the text after the last (none). Joined, they are what Qwen2_5_VLProcessor puts in
        place of the image token."""
        if rows <= 0 or cols <= 0 or rows % self.merge_size or cols % self.merge_size:
            raise ValueError(
                f"a {rows} x {cols} grid of patches is not whole {self.merge_size} x "
                f"{self.merge_size} blocks"
            )
        return "", self.image_token * (rows * cols // self.merge_size**2), ""

    def to_rgb(self, image: PIL.Image.Image) -> PIL.Image.Image:
        """The image in RGB, as the processor first makes it."""
        return to_rgb(image, self.do_convert_rgb)


def _image_token(tokenizer_config: dict[str, Any]) -> str | None:
    """The tokenizer's image_token, which Qwen2_5_VLProcessor takes where the tokenizer
    has one: a top-level key of tokenizer_config.json (transformers 5's save) or a named
    extra special token; it may be an AddedToken's dict. Later sources win, in the order
    transformers' tokenizer sets them. None where the tokenizer has none."""
    found = None
    for source in (
        tokenizer_config.get("extra_special_tokens"),
        tokenizer_config,
        tokenizer_config.get("model_specific_special_tokens"),
    ):
        if not isinstance(source, dict):
            continue
        value = source.get("image_token")
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found = value
    return found
