"""What every image processor here shares with transformers' PIL-based ones: the image
made RGB, its 8-bit pixels as a tensor, their resize (PIL's, to the bit), their rescale
and normalisation (in the dtypes transformers uses, so that the pixel values are equal
to the bit), the processed image, and the reading of a model folder's JSON files."""

from __future__ import annotations

import functools
import json
import struct
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import torch
from hetero_infer.engine.multimodal.pillow_arrow import rgbx_pixels
from hetero_infer.engine.params.image_input import content_hash
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import pixel_levels, resize_like_pillow, with_padding

# The settings every processor here has, by transformers' names.
PIXEL_SETTINGS = (
    "do_resize",
    "do_rescale",
    "do_normalize",
    "do_convert_rgb",
    "resample",
    "rescale_factor",
    "image_mean",
    "image_std",
)
# Those of them that change an image's values but never its shape, which
# mm_processor_kwargs may set (ImagePrompts.for_model).
VALUE_SETTINGS = frozenset(PIXEL_SETTINGS) - {"do_resize", "do_convert_rgb"}


@dataclass(frozen=True)
class ProcessedImage:
    pixel_values: torch.Tensor  # [tiles, 3, tile height, tile width] float32
    # The grid of tiles before a global image (Idefics3's); 0 and 0 for one tile.
    rows: int
    cols: int


def to_rgb(image: PIL.Image.Image, convert: bool) -> PIL.Image.Image:
    """The image in RGB, as a processor first makes it (``convert``: its do_convert_rgb;
    off, an image not already RGB is refused)."""
    if not convert:
        if image.mode != "RGB":
            raise ValueError(f"a {image.mode} image, and do_convert_rgb is off")
        return image
    # Transparent parts become white, as transformers composites them.
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = PIL.Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return PIL.Image.alpha_composite(white, rgba).convert("RGB")
    if image.mode == "RGB":
        return image  # convert() would copy it, and nothing here writes it
    return image.convert("RGB")


def pixels_of(image: PIL.Image.Image) -> torch.Tensor:
    """An RGB image's pixels as [H, W, 3] uint8, to be read only (nothing here writes
    pixels; each step makes new ones): a view of where Pillow keeps them (pillow_arrow.py),
    4 bytes a pixel, which the resize reads as they lie; else on the bytes of its
    tobytes() without another copy."""
    kept = rgbx_pixels(image)
    if kept is not None:
        return torch.from_numpy(kept)[..., :3]
    array = np.frombuffer(image.tobytes(), dtype=np.uint8).reshape(image.height, image.width, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's warning that the array is read only
        return torch.from_numpy(array)


def pixels_hash(pixels: torch.Tensor) -> int:
    """The content hash of an image given decoded: its pixels' bytes as they lie, then
    their layout and the size. Where they are a view of Pillow's memory, each pixel's
    padding byte is hashed with it: hashing a third more bytes costs less than packing
    them first (a 12 MP photo: 7 ms, where packing and hashing took 15)."""
    height, width = pixels.shape[:2]
    padded = with_padding(pixels)
    memory, layout = (pixels.contiguous(), b"RGB") if padded is None else (padded, b"RGBX")
    return content_hash(memoryview(memory.numpy()), layout, struct.pack("<II", width, height))


def resized(
    pixels: torch.Tensor,
    height: int,
    width: int,
    resample: PIL.Image.Resampling,
    cpu_kernels: bool = True,
) -> torch.Tensor:
    """[H, W, 3] uint8 pixels resized to ``height`` x ``width`` as PIL's
    ``Image.resize`` resizes their image, to the bit: by the CPU kernels where they
    follow the installed Pillow (several times faster, and on all threads) and
    ``cpu_kernels`` allows them, else by PIL."""
    if cpu_kernels:
        done = resize_like_pillow(pixels, height, width, resample)
        if done is not None:
            return done
    image = PIL.Image.fromarray(pixels.contiguous().numpy())
    return pixels_of(image.resize((width, height), resample=resample))


def to_tensor(pixels: torch.Tensor) -> torch.Tensor:
    """[H, W, 3] pixels as [3, H, W] (a view)."""
    return pixels.permute(2, 0, 1)


def rescale_and_normalize(
    tiles: torch.Tensor,
    rescale_factor: float | None,
    mean: tuple[float, ...] | None,
    std: tuple[float, ...] | None,
    cpu_kernels: bool = True,
) -> torch.Tensor:
    """uint8 tiles [n, 3, H, W] -> float32, rescaled (None: not) and normalized (None:
    not), each value as transformers computes it. A channel's pixels take 256 values, so
    each is computed once (level_values) and the pixels look theirs up: equal to the bit,
    and ~8x faster than computing per pixel in float64 (SmolVLM's 17 tiles of 364 x 364:
    52 -> 7 ms); on the CPU kernels where they are built (numpy's take first widens
    every pixel to an int64 index)."""
    levels = level_values(rescale_factor, mean, std)
    looked_up = pixel_levels(tiles, levels) if cpu_kernels else None
    if looked_up is not None:
        return looked_up
    table = levels.numpy()
    pixels = tiles.numpy()
    values = np.empty(pixels.shape, dtype=np.float32)
    for channel in range(3):
        np.take(table[channel], pixels[:, channel], out=values[:, channel])
    return torch.from_numpy(values)


@functools.lru_cache(maxsize=16)
def level_values(
    rescale_factor: float | None,
    mean: tuple[float, ...] | None,
    std: tuple[float, ...] | None,
) -> torch.Tensor:
    """[3, 256] float32: each channel's value for each 8-bit level. transformers rescales
    in float64 and rounds to float32, then normalizes in float32."""
    levels = torch.arange(256, dtype=torch.float64).expand(3, 256)
    if rescale_factor is not None:
        values = (levels * rescale_factor).to(torch.float32)
    else:
        values = levels.to(torch.float32)
    if mean is not None and std is not None:
        mean_t = torch.tensor(mean, dtype=torch.float32).view(3, 1)
        std_t = torch.tensor(std, dtype=torch.float32).view(3, 1)
        values = (values - mean_t) / std_t
    return values


def read_json(path: Path) -> dict[str, Any]:
    """A folder's JSON file; {} where it has none."""
    if not path.exists():
        return {}
    with path.open() as file:
        return json.load(file)


def pixel_settings(settings: Mapping[str, Any], defaults: Any) -> dict[str, Any]:
    """PIXEL_SETTINGS from a processor config's ``settings``, ``defaults``' (a processor
    with its defaults) where a key is left out; a single mean or std stands for all three
    channels, as transformers repeats it."""
    found = {name: settings.get(name, getattr(defaults, name)) for name in PIXEL_SETTINGS}
    found["resample"] = PIL.Image.Resampling(found["resample"])
    for name in ("image_mean", "image_std"):
        found[name] = _three(found[name])
    return found


def check_mean_and_std(processor: str, mean: Sequence[float], std: Sequence[float]) -> None:
    if len(mean) != 3 or len(std) != 3:
        raise ConfigError(f"{processor} image processor: image_mean and image_std need 3 values")


def normalized(tiles: torch.Tensor, settings: Any) -> torch.Tensor:
    """rescale_and_normalize as a processor's PIXEL_SETTINGS say (their do_* flags)."""
    return rescale_and_normalize(
        tiles,
        settings.rescale_factor if settings.do_rescale else None,
        settings.image_mean if settings.do_normalize else None,
        settings.image_std if settings.do_normalize else None,
        settings.cpu_kernels,
    )


def _three(values: float | Sequence[float]) -> tuple[float, ...]:
    if isinstance(values, int | float):
        return (float(values),) * 3
    return tuple(values)
