"""An image's pixels (pixels.pixels_of: where Pillow keeps them, or through tobytes) and
their values' lookup (pixels.rescale_and_normalize, on the CPU kernels and in numpy
without them) against computing each pixel as transformers does: float64 rescale
rounded to float32, then a float32 normalize."""

from __future__ import annotations

import struct

import numpy as np
import PIL.Image
import pytest
import torch
from hetero_infer.engine.multimodal import pixels
from hetero_infer.engine.multimodal.pillow_arrow import rgbx_pixels
from hetero_infer.engine.multimodal.pixels import (
    pixels_hash,
    pixels_of,
    rescale_and_normalize,
    resized,
    to_tensor,
)
from hetero_infer.engine.params.image_input import content_hash
from PIL.Image import Resampling

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def per_pixel(tiles, rescale_factor, mean, std) -> torch.Tensor:
    values = tiles.to(torch.float64)
    values = (values * rescale_factor if rescale_factor is not None else values).float()
    if mean is not None:
        values = (values - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    return values


@pytest.mark.parametrize(
    "rescale_factor, mean, std",
    [(1 / 255, CLIP_MEAN, CLIP_STD), (1 / 255, (0.5,) * 3, (0.5,) * 3), (1 / 255, None, None),
     (None, CLIP_MEAN, CLIP_STD), (None, None, None)],
)  # fmt: skip
@pytest.mark.parametrize("kernels", [True, False])
def test_lookup_equals_each_pixel_computed(rescale_factor, mean, std, kernels, monkeypatch) -> None:
    if not kernels:
        monkeypatch.setattr(pixels, "pixel_levels", lambda tiles, levels: None)
    generator = torch.Generator().manual_seed(0)
    tiles = torch.randint(0, 256, (5, 3, 7, 9), dtype=torch.uint8, generator=generator)
    tiles[0, :, 0, :] = torch.arange(9, dtype=torch.uint8) * 31 + 7  # both ends of 0..255
    tiles[0, :, 1, 0], tiles[0, :, 1, 1] = 0, 255
    looked_up = rescale_and_normalize(tiles, rescale_factor, mean, std)
    expected = per_pixel(tiles, rescale_factor, mean, std)
    assert looked_up.dtype == torch.float32 and looked_up.shape == tiles.shape
    assert torch.equal(looked_up.view(torch.int32), expected.view(torch.int32))


def test_an_image_read_through_its_strides() -> None:
    """to_tensor gives a [3, H, W] view of the image's [H, W, 3] pixels, not a copy."""
    image = PIL.Image.fromarray(np.random.default_rng(0).integers(0, 256, (6, 10, 3), np.uint8))
    tiles = to_tensor(pixels_of(image))[None]
    assert not tiles.is_contiguous()
    assert torch.equal(
        rescale_and_normalize(tiles, 1 / 255, CLIP_MEAN, CLIP_STD),
        per_pixel(tiles.contiguous(), 1 / 255, CLIP_MEAN, CLIP_STD),
    )


@pytest.fixture
def small_pillow_blocks():
    """Pillow's blocks of image memory at their smallest (a page): an image of more
    rows than fit in one lies in several blocks, as one past 16 MB does by default."""
    before = PIL.Image.core.get_block_size()
    PIL.Image.core.set_block_size(4096)
    yield
    PIL.Image.core.set_block_size(before)


def random_image(height: int, width: int) -> PIL.Image.Image:
    return PIL.Image.fromarray(
        np.random.default_rng(1).integers(0, 256, (height, width, 3), np.uint8)
    )


def as_bytes(image: PIL.Image.Image) -> np.ndarray:
    return np.frombuffer(image.tobytes(), np.uint8).reshape(image.height, image.width, 3)


@pytest.mark.parametrize("size", [(1, 1), (7, 33), (480, 640)])
def test_pixels_are_read_where_pillow_keeps_them(size) -> None:
    """Pillow's own memory through its Arrow export (a pixel's 4 bytes: R, G, B, padding),
    read in place: the bytes tobytes() gives."""
    image = random_image(*size)
    kept = rgbx_pixels(image)
    assert kept is not None and kept.shape == (*size, 4)
    assert np.array_equal(kept[..., :3], as_bytes(image))
    view = pixels_of(image)
    assert np.array_equal(view.numpy(), as_bytes(image))
    # A view of Pillow's memory, not a copy.
    assert view.data_ptr() == kept.ctypes.data and view.stride() == (4 * size[1], 4, 1)


@pytest.mark.parametrize("resample", [Resampling.LANCZOS, Resampling.BICUBIC])
@pytest.mark.parametrize(("size", "new_size"), [((480, 640), (192, 256)), ((300, 100), (100, 90))])
def test_pillows_pixels_resize_as_pillow_resizes_them(size, new_size, resample) -> None:
    """Pixels on Pillow's memory resized with their padding bytes (no pass to pack them),
    to the bit what Image.resize gives (the second size: Pillow 13's vertical pass
    first), and handed on in the same layout."""
    image = random_image(*size)
    view = pixels_of(image)
    assert not view.is_contiguous()
    got = resized(view, *new_size, resample)
    expected = image.resize(new_size[::-1], resample=resample)
    assert np.array_equal(got.numpy(), as_bytes(expected))
    assert got.stride() == (4 * new_size[1], 4, 1)


def test_a_decoded_images_hash_reads_its_pixels_where_pillow_keeps_them() -> None:
    """Pillow's 4 bytes a pixel hashed as they lie (no packed copy first), with the
    layout and the size: equal pixels hash alike, one pixel more or less does not."""
    image = random_image(48, 64)
    changed = image.copy()
    changed.putpixel((5, 7), tuple(255 - v for v in image.getpixel((5, 7))))
    got = pixels_hash(pixels_of(image))
    assert got == pixels_hash(pixels_of(image.copy()))
    assert got != pixels_hash(pixels_of(changed))
    size = struct.pack("<II", 64, 48)
    assert got == content_hash(memoryview(rgbx_pixels(image)), b"RGBX", size)


def test_an_image_in_several_blocks_is_read_through_tobytes(small_pillow_blocks) -> None:
    image = random_image(40, 300)  # 1200 bytes a row: 3 rows a block
    assert rgbx_pixels(image) is None
    assert np.array_equal(pixels_of(image).numpy(), as_bytes(image))


def test_only_rgb_images_are_read_in_place() -> None:
    assert rgbx_pixels(random_image(4, 4).convert("RGBA")) is None
    assert rgbx_pixels(random_image(4, 4).convert("L")) is None
