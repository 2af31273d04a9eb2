"""Idefics3's (SmolVLM's) image processing for one image, as transformers' PIL-based
Idefics3 image processor does it, to the bit: the image is resized so its longest edge is
``longest_edge`` (aspect ratio kept), then up to whole multiples of the encoder's tile
size, cut into rows x cols tiles, and followed by the whole image squeezed into one more
tile (the "global" image); without splitting it is squeezed into one tile. Every resize
is PIL's on the 8-bit RGB image, with the configured filter (LANCZOS in every SmolVLM).

And the prompt text that stands for the image where its ``<image>`` marker was, as
transformers' Idefics3Processor expands it: each tile's ``image_seq_len`` image tokens
(one per embedding the vision encoder gives it) behind a ``<row_i_col_j>`` tag, a newline
after each row of tiles, then the global image's behind ``<global-img>``, fenced by
``<fake_token_around_image>``.
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

IMAGE_TOKEN = "<image>"
FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"
# transformers caps a resized image's longest edge at 4k whatever the config says.
MAX_IMAGE_SIZE = 4096


@dataclass(frozen=True)
class Idefics3ImageProcessor:
    """The image processor's settings (transformers' names and defaults, which stand
    where a config leaves a key out) and the image tokens per tile."""

    # What mm_processor_kwargs may set over the folder's (ImagePrompts.for_model).
    OVERRIDABLE: ClassVar[frozenset[str]] = VALUE_SETTINGS | {"size", "do_image_splitting"}

    image_seq_len: int
    longest_edge: int = 4 * 364  # size["longest_edge"]
    tile_size: int = 364  # max_image_size["longest_edge"]: the vision encoder's input
    do_image_splitting: bool = True
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True
    resample: PIL.Image.Resampling = PIL.Image.Resampling.LANCZOS
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # Whether the CPU kernels resize and look up the pixels (the engine's cpu_kernels;
    # the same values either way).
    cpu_kernels: bool = True

    def __post_init__(self) -> None:
        if self.image_seq_len <= 0 or self.tile_size <= 0 or self.longest_edge <= 0:
            raise ConfigError(
                f"Idefics3 image processor: image_seq_len ({self.image_seq_len}), "
                f"max_image_size ({self.tile_size}) and size ({self.longest_edge}) must be > 0"
            )
        check_mean_and_std("Idefics3", self.image_mean, self.image_std)

    @classmethod
    def from_folder(
        cls, path: Path, overrides: Mapping[str, Any] | None = None
    ) -> Idefics3ImageProcessor:
        """From a model folder: the image processor's settings in preprocessor_config.json
        (the Hub's SmolVLM folders) or under "image_processor" in processor_config.json
        (transformers 5 saves them there), image_seq_len from processor_config.json or
        else from the model's config.json, as the model itself computes it. ``overrides``
        (mm_processor_kwargs) go over the files' settings, as keyword arguments to
        transformers' from_pretrained do."""
        settings = read_json(path / "preprocessor_config.json")
        processor = read_json(path / "processor_config.json")
        settings.update(processor.get("image_processor", {}))
        settings.update(overrides or {})
        image_seq_len = processor.get("image_seq_len")
        if image_seq_len is None:
            image_seq_len = _image_seq_len_of_model(path / "config.json")
        defaults = cls(image_seq_len=image_seq_len)
        for key in ("size", "max_image_size"):
            if key in settings and "longest_edge" not in settings[key]:
                raise ConfigError(
                    f"{path}: image processor {key} {settings[key]} has no longest_edge"
                )
        longest_edge = settings.get("size", {}).get("longest_edge", defaults.longest_edge)
        tile_size = settings.get("max_image_size", {}).get("longest_edge", defaults.tile_size)
        return cls(
            image_seq_len=int(image_seq_len),
            longest_edge=int(longest_edge),
            tile_size=int(tile_size),
            do_image_splitting=settings.get("do_image_splitting", defaults.do_image_splitting),
            **pixel_settings(settings, defaults),
        )

    @property
    def image_token(self) -> str:
        return IMAGE_TOKEN

    @property
    def largest_pixels(self) -> int:
        """The most pixels an image is resized to (its longest edge's square)."""
        return self.longest_edge**2

    @property
    def marker(self) -> str:
        """The token the chat template writes for an image: its image token."""
        return IMAGE_TOKEN

    def placeholder_parts(self, rows: int, cols: int) -> tuple[str, str, str]:
        """placeholder_text as (text before its special tokens, them, text after): all
        of it between special tokens."""
        return "", self.placeholder_text(rows, cols), ""

    def process(self, image: PIL.Image.Image) -> ProcessedImage:
        """The image's tiles, row by row, then the global image (or the one tile)."""
        return self.process_rgb(pixels_of(self.to_rgb(image)))

    def process_rgb(self, pixels: torch.Tensor) -> ProcessedImage:
        """process() of an image to_rgb() has made, as its pixels (pixels_of)."""
        if self.do_resize:
            pixels = self._resize(pixels, *_fit_longest_edge(*pixels.shape[:2], self.longest_edge))
        tile = self.tile_size
        rows = cols = 0
        if not self.do_image_splitting:
            tiles = to_tensor(self._resize(pixels, tile, tile))[None]
        else:
            pixels = self._resize(pixels, *_whole_tiles(*pixels.shape[:2], tile))
            height, width = pixels.shape[:2]
            if height > tile or width > tile:
                rows, cols = height // tile, width // tile
                grid = to_tensor(pixels)  # [3, rows * tile, cols * tile]
                grid = grid.view(3, rows, tile, cols, tile).permute(1, 3, 0, 2, 4)
                global_image = to_tensor(self._resize(pixels, tile, tile))
                tiles = torch.cat([grid.reshape(rows * cols, 3, tile, tile), global_image[None]])
            else:
                tiles = to_tensor(pixels)[None]
        return ProcessedImage(normalized(tiles, self), rows, cols)

    def placeholder_text(self, rows: int, cols: int) -> str:
        """The text that replaces one ``<image>`` marker for an image processed into
        ``rows`` x ``cols`` tiles (ProcessedImage's) and the global image."""
        image_tokens = IMAGE_TOKEN * self.image_seq_len
        global_image = f"{FAKE_IMAGE_TOKEN}{GLOBAL_IMAGE_TOKEN}{image_tokens}{FAKE_IMAGE_TOKEN}"
        if rows == 0 and cols == 0:
            return global_image
        grid = "".join(
            "".join(
                f"{FAKE_IMAGE_TOKEN}<row_{row + 1}_col_{col + 1}>{image_tokens}"
                for col in range(cols)
            )
            + "\n"
            for row in range(rows)
        )
        return f"{grid}\n{global_image}"

    def to_rgb(self, image: PIL.Image.Image) -> PIL.Image.Image:
        """The image in RGB, as the processor first makes it."""
        return to_rgb(image, self.do_convert_rgb)

    def _resize(self, pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
        return resized(pixels, height, width, self.resample, self.cpu_kernels)


def _fit_longest_edge(height: int, width: int, longest_edge: int) -> tuple[int, int]:
    """The size with the longest edge ``longest_edge`` and the other rounded up to even,
    then capped at MAX_IMAGE_SIZE. The float expressions are transformers' own: another
    way to write the same ratio can round to a pixel more or less."""
    aspect_ratio = width / height
    if width >= height:
        width = longest_edge
        height = int(width / aspect_ratio)
        height += height % 2
    else:
        height = longest_edge
        width = int(height * aspect_ratio)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect_ratio = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width = MAX_IMAGE_SIZE
        height = int(width / aspect_ratio)
    elif height > width and height > MAX_IMAGE_SIZE:
        height = MAX_IMAGE_SIZE
        width = int(height * aspect_ratio)
    return max(height, 1), max(width, 1)


def _whole_tiles(height: int, width: int, tile: int) -> tuple[int, int]:
    """The size rounded up to whole tiles: the longest edge first, the other from it
    through the aspect ratio (transformers' order, which decides a tile more or less)."""
    aspect_ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect_ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect_ratio) / tile) * tile
    return height, width


def _image_seq_len_of_model(config_path: Path) -> int:
    """Image tokens per tile: a tile's patches, fewer by the pixel shuffle's factor in
    each direction. The defaults are transformers' Idefics3Config's."""
    if not config_path.exists():
        raise ConfigError(f"{config_path.parent}: no image_seq_len and no config.json")
    config = read_json(config_path)
    vision = config.get("vision_config", {})
    patches_per_side = vision.get("image_size", 224) // vision.get("patch_size", 32)
    return int(patches_per_side**2 / config.get("scale_factor", 2) ** 2)
