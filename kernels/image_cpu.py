"""An image's preprocessing on the CPU kernels, equal to the bit to what transformers'
PIL-based processors compute: Pillow's resize (kernels/csrc/image_resample_cpu.cpp) and
the 8-bit pixels' float values by a lookup in each channel's 256 levels
(pixel_levels_cpu.cpp). RGB pixels as Pillow keeps them (4 bytes each: R, G, B and a
padding byte) are resized as they lie (with_padding).

``resize_like_pillow`` is ``Image.resize`` with a convolution filter. Pillow resizes in
two passes, one along each axis; each output value is a weighted sum of a run of input
values, the weights taken from the filter, normalised to sum to 1, and rounded to 22-bit
fixed point. The weights and their bounds are computed here as Pillow computes them (the
same double arithmetic, the C library's ``sin`` through ``math.sin``), once per (input
size, output size, filter); the kernels do the sums as Pillow does, in int32, and share
the rows between threads, where Pillow runs on one thread (SmolVLM's 640 x 480 -> 256 x
192 LANCZOS: 2.9 ms in Pillow, below 0.5 ms here).

Which pass runs first changes the result (the first one's output is rounded to 8 bits),
and Pillow 13 changed it: before, the horizontal pass always ran first; since, the
vertical one does where the height shrinks by more than twice as many pixels as the
width. ``resize_like_pillow`` follows the installed Pillow, and leaves a Pillow it does
not know (a later major version), a filter it does not know, or a machine without the
kernels to Pillow itself (``None``). The kernels are used where this process has them
built, never compiled here for an image.

The work is shared between torch's threads only on the main thread, where an offline
engine runs its steps: a parallel region started from another thread (the server's
workers, which preprocess images as they arrive) gives OpenMP a second pool of
threads, and with more threads than cores libgomp stops spinning between regions,
which slows every step of the engine's own thread (AsyncEngine.load). There each
call runs on its thread alone, still several times faster than Pillow's loop.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np
import PIL
import PIL.Image
import torch
from hetero_infer.kernels.cpu_extension import built_cpu_kernels

PRECISION_BITS = 22  # Pillow's: 32 bits less 8 for the value and 2 for overflow


def _sin(x: np.ndarray) -> np.ndarray:
    """The C library's sin of each value (math.sin calls it), which Pillow's filters
    call: numpy's own may differ in the last bit, which can move a rounded weight."""
    return np.array([math.sin(v) for v in x.ravel().tolist()]).reshape(x.shape)


def _cos(x: np.ndarray) -> np.ndarray:
    return np.array([math.cos(v) for v in x.ravel().tolist()]).reshape(x.shape)


def _sinc(x: np.ndarray) -> np.ndarray:
    scaled = x * math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(x == 0.0, 1.0, _sin(scaled) / scaled)


def _box(x: np.ndarray) -> np.ndarray:
    return np.where((x > -0.5) & (x <= 0.5), 1.0, 0.0)


def _bilinear(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


# Pillow writes 0.54f and 0.46f: float constants, widened to double.
_HAMMING_A, _HAMMING_B = float(np.float32(0.54)), float(np.float32(0.46))


def _hamming(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    scaled = x * math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        inside = _sin(scaled) / scaled * (_HAMMING_A + _HAMMING_B * _cos(scaled))
    return np.where(x == 0.0, 1.0, np.where(x >= 1.0, 0.0, inside))


def _bicubic(x: np.ndarray) -> np.ndarray:
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _lanczos(x: np.ndarray) -> np.ndarray:
    inside = (x >= -3.0) & (x < 3.0)
    return np.where(inside, _sinc(x) * _sinc(x / 3), 0.0)


# Each filter (on an array of positions) with its support, as Pillow defines them.
FILTERS = {
    PIL.Image.Resampling.BOX: (_box, 0.5),
    PIL.Image.Resampling.BILINEAR: (_bilinear, 1.0),
    PIL.Image.Resampling.HAMMING: (_hamming, 1.0),
    PIL.Image.Resampling.BICUBIC: (_bicubic, 2.0),
    PIL.Image.Resampling.LANCZOS: (_lanczos, 3.0),
}


@functools.lru_cache(maxsize=256)
def coefficients(
    in_size: int, out_size: int, resample: PIL.Image.Resampling
) -> tuple[torch.Tensor, torch.Tensor]:
    """(bounds [out_size, 2] int32: each output's first input and number of taps,
    weights [out_size, taps] int32: its taps' fixed-point weights), as Pillow computes
    them for resizing ``in_size`` values to ``out_size``: the same double operations in
    the same order, for all outputs at once."""
    kernel, filter_support = FILTERS[resample]
    scale = in_size / out_size
    filter_scale = max(scale, 1.0)
    support = filter_support * filter_scale
    width = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    # C's casts truncate toward zero.
    first = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    taps = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - first
    x = np.arange(width)
    used = x[None, :] < taps[:, None]
    values = kernel((x[None, :] + first[:, None] - center[:, None] + 0.5) * (1.0 / filter_scale))
    values = np.where(used, values, 0.0)
    # Pillow adds a row's values in order: cumsum does too (sum would add pairwise).
    total = np.cumsum(values, axis=1)[:, -1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(total != 0.0, values / total, values)
    scaled = values * float(1 << PRECISION_BITS)
    # Rounded half away from zero, then truncated, as Pillow's (int)(v +- 0.5).
    weights = np.trunc(np.where(values < 0, scaled - 0.5, scaled + 0.5)).astype(np.int32)
    bounds = np.stack([first, taps], axis=1).astype(np.int32)
    return torch.from_numpy(bounds), torch.from_numpy(np.ascontiguousarray(weights))


def vertical_first(height: int, width: int, out_height: int, out_width: int) -> bool | None:
    """Whether the installed Pillow runs the vertical pass first; None for a Pillow
    whose order is not known here."""
    major = int(PIL.__version__.split(".")[0])
    if major <= 12:
        return False
    if major == 13:
        shrink = height - out_height
        return shrink > 0 and shrink > (width - out_width) * 2
    return None


def resize_like_pillow(
    pixels: torch.Tensor, height: int, width: int, resample: PIL.Image.Resampling
) -> torch.Tensor | None:
    """``pixels`` (uint8 [height, width, channels]: contiguous, or RGB pixels 4 bytes
    apart as Pillow keeps them, which come out the same way) resized as
    ``Image.resize((width, height), resample)`` resizes the image; None where this
    cannot follow Pillow (see the module's docstring)."""
    kernels = built_cpu_kernels()
    in_height, in_width, channels = pixels.shape
    order = vertical_first(in_height, in_width, height, width)
    if kernels is None or resample not in FILTERS or order is None:
        return None
    if (in_height, in_width) == (height, width):
        return pixels
    # Pillow's RGB pixels with their padding bytes, which are resampled with them (as
    # Pillow resamples RGB) and dropped after: no pass to pack them first (a 12 MP
    # photo's: ~10 ms).
    padded = with_padding(pixels)
    pixels = pixels.contiguous() if padded is None else padded
    parallel = _may_share_threads()

    def horizontal(image: torch.Tensor) -> torch.Tensor:
        if image.shape[1] == width:
            return image
        weights = coefficients(image.shape[1], width, resample)
        return kernels.resample_horizontal(image, *weights, parallel)

    def vertical(image: torch.Tensor) -> torch.Tensor:
        if image.shape[0] == height:
            return image
        weights = coefficients(image.shape[0], height, resample)
        return kernels.resample_vertical(image, *weights, parallel)

    out = horizontal(vertical(pixels)) if order else vertical(horizontal(pixels))
    return out[..., :channels]


def with_padding(pixels: torch.Tensor) -> torch.Tensor | None:
    """RGB pixels [height, width, 3] that lie 4 bytes apart, as Pillow keeps them (a
    view of its memory), as the [height, width, 4] they are a view of: each pixel with
    its padding byte. None for pixels laid out otherwise."""
    height, width, channels = pixels.shape
    if channels != 3 or pixels.stride() != (4 * width, 4, 1):
        return None
    return pixels.as_strided((height, width, 4), (4 * width, 4, 1))


def pixel_levels(tiles: torch.Tensor, levels: torch.Tensor) -> torch.Tensor | None:
    """uint8 ``tiles`` [n, channels, H, W] (any strides) as float32: each pixel the value
    its channel's ``levels`` [channels, 256] give its level; None without the kernels."""
    kernels = built_cpu_kernels()
    if kernels is None:
        return None
    return kernels.pixel_levels(tiles, levels, _may_share_threads())


def _may_share_threads() -> bool:
    """Whether this thread may start parallel regions (see the module's docstring)."""
    return threading.current_thread() is threading.main_thread()
