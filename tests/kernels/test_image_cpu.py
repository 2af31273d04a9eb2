"""An image's preprocessing on the CPU kernels (kernels/image_cpu.py): PIL's resize,
equal to the installed Pillow's result to the bit, for every filter it follows,
shrinking and growing either axis (so both pass orders of Pillow 13 are taken), on one
and three channels, Pillow itself where the order of a Pillow version is not known
here; the pixels' levels looked up."""

from __future__ import annotations

import threading

import numpy as np
import PIL
import PIL.Image
import pytest
import torch
from hetero_infer.engine.multimodal.pixels import pixels_of, resized
from hetero_infer.kernels import image_cpu
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.image_cpu import pixel_levels, resize_like_pillow

from tests.kernels.checks import refusals, strided

Resampling = PIL.Image.Resampling
FILTERS = [
    Resampling.LANCZOS,
    Resampling.BICUBIC,
    Resampling.BILINEAR,
    Resampling.BOX,
    Resampling.HAMMING,
]
# (width, height) -> (width, height): shrinking and growing each axis, 1-pixel sides,
# a height shrunk by far more pixels than the width (Pillow 13 runs that pass first),
# the vision processors' own (SmolVLM's 640 x 480 to a 256 longest edge, then tiles).
SIZES = [
    ((640, 480), (256, 192)),
    ((256, 192), (64, 64)),
    ((33, 71), (64, 64)),
    ((7, 900), (64, 64)),
    ((306, 292), (254, 53)),
    ((156, 86), (122, 30)),
    ((100, 37), (300, 111)),
    ((1000, 3), (17, 5)),
    ((64, 64), (64, 200)),
    ((90, 64), (31, 64)),
    ((1, 1), (5, 3)),
    ((5, 3), (1, 1)),
]


def noise(width: int, height: int, channels: int, seed: int) -> np.ndarray:
    shape = (height, width) if channels == 1 else (height, width, channels)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


@pytest.mark.parametrize("resample", FILTERS)
@pytest.mark.parametrize(("size", "new_size"), SIZES)
@pytest.mark.parametrize("channels", [3, 1])
def test_equal_to_pillow(resample, size, new_size, channels):
    assert load_cpu_kernels() is not None
    pixels = noise(*size, channels, seed=sum(size) + sum(new_size))
    expected = np.asarray(PIL.Image.fromarray(pixels).resize(new_size, resample=resample))
    tensor = torch.from_numpy(pixels.reshape(size[1], size[0], channels))
    got = resize_like_pillow(tensor, new_size[1], new_size[0], resample)
    assert got is not None
    assert np.array_equal(got.numpy().reshape(expected.shape), expected)


@pytest.mark.parametrize("channels", [2, 4])
def test_two_and_four_channels_each_resized_as_alone(channels):
    """Each channel as Pillow resizes a one-channel image (Pillow's own LA and RGBA
    resizes premultiply the alpha, which is not what is asked here)."""
    pixels = noise(37, 29, channels, seed=channels)
    got = resize_like_pillow(torch.from_numpy(pixels), 13, 50, Resampling.BICUBIC)
    for c in range(channels):
        alone = PIL.Image.fromarray(np.ascontiguousarray(pixels[..., c]))
        expected = alone.resize((50, 13), resample=Resampling.BICUBIC)
        assert np.array_equal(got[..., c].numpy(), np.asarray(expected)), c


def test_random_sizes_equal_to_pillow():
    rng = np.random.default_rng(7)
    for _ in range(40):
        width, height, new_width, new_height = (int(v) for v in rng.integers(1, 200, 4))
        resample = FILTERS[int(rng.integers(len(FILTERS)))]
        pixels = noise(width, height, 3, seed=int(rng.integers(1 << 30)))
        expected = PIL.Image.fromarray(pixels).resize((new_width, new_height), resample=resample)
        got = resize_like_pillow(torch.from_numpy(pixels), new_height, new_width, resample)
        assert np.array_equal(got.numpy(), np.asarray(expected)), (width, height, new_width)


@pytest.mark.parametrize(
    ("version", "expected"), [("12.3.0", False), ("10.4.0", False), ("13.0.0", True)]
)
def test_the_pass_order_follows_the_pillow_version(monkeypatch, version, expected):
    """Height shrunk by 200 pixels, width by 10: Pillow 13 goes vertical first."""
    monkeypatch.setattr(PIL, "__version__", version)
    assert image_cpu.vertical_first(300, 100, 100, 90) is expected
    assert image_cpu.vertical_first(300, 100, 290, 90) is False


# (width, height) -> (width, height) at the edges of Pillow 13's rule: the height shrunk
# by twice what the width is (8 and 4: horizontal first), by one pixel more (vertical),
# by one pixel with the width grown (vertical), not at all (horizontal).
PILLOW_13_EDGES = [
    ((10, 20), (6, 12), False),
    ((10, 21), (6, 12), True),
    ((10, 11), (20, 10), True),
    ((10, 10), (20, 10), False),
]


@pytest.mark.parametrize(("size", "new_size", "vertical"), PILLOW_13_EDGES)
def test_pillow_13s_pass_order_at_its_edges(monkeypatch, size, new_size, vertical):
    pixels = noise(*size, 3, seed=sum(size))
    expected = PIL.Image.fromarray(pixels).resize(new_size, resample=Resampling.BICUBIC)
    got = resize_like_pillow(torch.from_numpy(pixels), new_size[1], new_size[0], Resampling.BICUBIC)
    assert np.array_equal(got.numpy(), np.asarray(expected))
    monkeypatch.setattr(PIL, "__version__", "13.0.0")
    assert image_cpu.vertical_first(size[1], size[0], new_size[1], new_size[0]) is vertical


def test_a_pillow_or_filter_not_known_here_is_left_to_pillow(monkeypatch):
    pixels = torch.from_numpy(noise(40, 30, 3, seed=1))
    assert resize_like_pillow(pixels, 10, 10, Resampling.NEAREST) is None
    monkeypatch.setattr(PIL, "__version__", "14.0.0")
    assert resize_like_pillow(pixels, 10, 10, Resampling.LANCZOS) is None
    # ... which pixels.resized then asks, with the same result.
    image = PIL.Image.fromarray(pixels.numpy())
    expected = pixels_of(image.resize((10, 10), resample=Resampling.LANCZOS))
    assert torch.equal(resized(pixels, 10, 10, Resampling.LANCZOS), expected)


def test_an_image_of_its_size_is_itself_and_without_kernels_none(monkeypatch):
    """(None: the callers' own way, Pillow's or torch's)"""
    pixels = torch.from_numpy(noise(40, 30, 3, seed=2))
    assert resize_like_pillow(pixels, 30, 40, Resampling.BICUBIC) is pixels
    monkeypatch.setattr(image_cpu, "built_cpu_kernels", lambda: None)
    assert resize_like_pillow(pixels, 10, 10, Resampling.BICUBIC) is None
    assert pixel_levels(torch.zeros(1, 3, 2, 2, dtype=torch.uint8), torch.zeros(3, 256)) is None


def resample_arguments(case: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(image, bounds, weights) of a 4 x 5 RGB image resampled to 2 outputs along either
    axis (the second's 2 taps, as many as its weights, end on the last row), but for
    ``case``."""
    parts = {
        "image": torch.zeros(4, 5, 3, dtype=torch.uint8),
        "bounds": torch.tensor([[0, 1], [2, 2]], dtype=torch.int32),
        "weights": torch.ones(2, 2, dtype=torch.int32),
    }
    bounds = parts["bounds"]
    how, _, name = case.partition(" ")  # "<how> <part>" for the layouts and dtypes
    match case:
        case "2-d image":
            parts["image"] = parts["image"][..., 0]
        case "bounds of 3":
            parts["bounds"] = torch.zeros(2, 3, dtype=torch.int32)
        case "weights of 3 outputs":
            parts["weights"] = torch.ones(3, 2, dtype=torch.int32)
        case "a start before the image":
            bounds[0, 0] = -1
        case "negative taps":
            bounds[0, 1] = -1
        case "more taps than weights":
            bounds[0, 1] = 3
        case "taps past the image":
            bounds[1, 0] = 4
        case "5 channels":
            parts["image"] = torch.zeros(4, 5, 5, dtype=torch.uint8)
        case _ if how == "1-d":
            parts[name] = parts[name].flatten()
        case _ if how in ("int32", "int64"):
            parts[name] = parts[name].to(getattr(torch, how))
        case _ if how == "strided":
            parts[name] = strided(parts[name])
    return parts["image"], parts["bounds"], parts["weights"]


RESAMPLE_REFUSALS = {
    r"image must be a contiguous uint8 \[height, width, channels\]": [
        "2-d image",
        "int32 image",
        "strided image",
    ],
    r"bounds must be a contiguous int32 \[outputs, 2\]": [
        "1-d bounds",
        "bounds of 3",
        "int64 bounds",
        "strided bounds",
    ],
    r"weights must be a contiguous int32 \[outputs, taps\]": [
        "1-d weights",
        "weights of 3 outputs",
        "int64 weights",
        "strided weights",
    ],
    "resample bounds out of the image": [
        "a start before the image",
        "negative taps",
        "more taps than weights",
        "taps past the image",
    ],
}


@pytest.mark.parametrize("axis", ["vertical", "horizontal"])
@pytest.mark.parametrize(("case", "message"), refusals(RESAMPLE_REFUSALS))
def test_resampling_refuses_what_it_cannot_read(axis, case, message):
    resample = getattr(load_cpu_kernels(), f"resample_{axis}")
    resample(*resample_arguments("none"), True)
    with pytest.raises(RuntimeError, match=message):
        resample(*resample_arguments(case), True)


def test_a_horizontal_pass_takes_1_to_4_channels():
    kernels = load_cpu_kernels()
    image, bounds, weights = resample_arguments("5 channels")
    assert kernels.resample_vertical(image, bounds, weights, True).shape == (2, 5, 5)
    with pytest.raises(RuntimeError, match="1 to 4 channels"):
        kernels.resample_horizontal(image, bounds, weights, True)


def test_off_the_main_thread_a_resize_runs_on_its_thread_alone(monkeypatch):
    """A worker thread's parallel region would leave OpenMP a second pool of threads,
    which slows the engine's steps: there the kernels are asked for one thread, with
    the same result."""
    kernels, asked = load_cpu_kernels(), []

    class Recording:
        def __getattr__(self, name):
            def call(*args):
                asked.append((name, args[-1]))
                return getattr(kernels, name)(*args)

            return call

    monkeypatch.setattr(image_cpu, "built_cpu_kernels", Recording)
    pixels = torch.from_numpy(noise(300, 200, 3, seed=3))
    expected = resize_like_pillow(pixels, 90, 120, Resampling.LANCZOS)
    results = []
    worker = threading.Thread(
        target=lambda: results.append(resize_like_pillow(pixels, 90, 120, Resampling.LANCZOS))
    )
    worker.start()
    worker.join()
    assert torch.equal(results[0], expected)
    # horizontal first (Pillow 13: the height shrinks by 110 pixels, the width by 180)
    assert asked == [
        ("resample_horizontal", True),
        ("resample_vertical", True),
        ("resample_horizontal", False),
        ("resample_vertical", False),
    ]


@pytest.mark.parametrize("contiguous", [True, False])
def test_pixel_levels_look_up_each_channels_level(contiguous):
    generator = torch.Generator().manual_seed(0)
    hwc = torch.randint(0, 256, (2, 5, 7, 3), dtype=torch.uint8, generator=generator)
    tiles = hwc.permute(0, 3, 1, 2)  # [2, 3, 5, 7] read through the HWC strides
    if contiguous:
        tiles = tiles.contiguous()
    levels = torch.randn(3, 256, generator=generator)
    got = pixel_levels(tiles, levels)
    expected = torch.stack([levels[c][tiles[:, c].long()] for c in range(3)], dim=1)
    assert got.is_contiguous() and torch.equal(got, expected)


PIXEL_LEVELS_REFUSALS = {
    r"pixels must be uint8 \[n, channels, height, width\]": ["3-d pixels", "int32 pixels"],
    r"levels must be a contiguous float32 \[channels, 256\]": [
        "1-d levels",
        "levels of 2 channels",
        "255 levels",
        "fp64 levels",
        "strided levels",
    ],
}


@pytest.mark.parametrize(("case", "message"), refusals(PIXEL_LEVELS_REFUSALS))
def test_pixel_levels_refuse_what_they_cannot_read(case, message):
    pixels, levels = torch.zeros(1, 3, 2, 2, dtype=torch.uint8), torch.zeros(3, 256)
    look_up = load_cpu_kernels().pixel_levels
    assert look_up(pixels, levels, True).shape == (1, 3, 2, 2)
    match case:
        case "3-d pixels":
            pixels = pixels[0]
        case "int32 pixels":
            pixels = pixels.int()
        case "1-d levels":
            levels = levels.flatten()
        case "levels of 2 channels":
            levels = levels[:2]
        case "255 levels":
            levels = levels[:, :255].contiguous()
        case "fp64 levels":
            levels = levels.double()
        case "strided levels":
            levels = strided(levels)
    with pytest.raises(RuntimeError, match=message):
        look_up(pixels, levels, True)
