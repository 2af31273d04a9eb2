"""M-RoPE's positions (Qwen2-VL, Qwen2.5-VL): three rows per token, time, height and
width, each rotating its own section of a head's frequencies (models/mrope.py).

A text token takes the same position in all three rows. An image's tokens, its rows x
cols grid after merging (ImageInput.grid), take (p, p + row, p + col) from the position
p where the image starts, and the text after it goes on from p + max(rows, cols): every
token behind an image sits rows * cols - max(rows, cols) positions before its index, as
transformers' get_rope_index places it. Where a step holds no image token every row is
the same, and the step runs on one row of positions (its decodes on the fast path).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hetero_infer.engine.params.image_input import ImageInput


def mrope_positions(images: Sequence[ImageInput], start: int, end: int) -> np.ndarray:
    """[3, end - start] the positions of a sequence's tokens [start, end), given its
    images with tokens before ``end`` (in prompt order)."""
    index = np.arange(start, end)
    rows = np.tile(index, (3, 1))
    shift = 0  # how far the tokens after the images so far sit before their index
    for image in images:
        grid_rows, grid_cols = image.grid
        first, last = max(image.start, start), min(image.end, end)
        if first < last:  # its tokens in the chunk
            k = np.arange(first - image.start, last - image.start)
            at = image.start - shift
            rows[0, first - start : last - start] = at
            rows[1, first - start : last - start] = at + k // grid_cols
            rows[2, first - start : last - start] = at + k % grid_cols
        behind = len(image.positions) - max(grid_rows, grid_cols)
        rows[:, max(image.end - start, 0) :] -= behind
        shift += behind
    return rows
