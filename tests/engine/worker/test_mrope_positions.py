"""engine/worker/mrope_positions.py: M-RoPE's three rows of positions equal
transformers' Qwen2.5-VL get_rope_index for prompts with images of several grids,
computed whole or chunk by chunk from any start, and for the tokens generated after."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from hetero_infer.engine.params.image_input import ImageInput
from hetero_infer.engine.worker.mrope_positions import mrope_positions
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

MERGE = 2
# (text tokens before it, the image's merged grid rows x cols), then 5 text tokens; images
# always have text between them (<|vision_end|><|vision_start|> at least)
LAYOUT = [(3, (2, 3)), (4, (3, 3)), (2, (1, 4))]


def prompt() -> tuple[list[int], list[ImageInput], list[tuple[int, int, int]]]:
    """Token types (0 text, 1 image), the images, their grid_thw in patches."""
    types_, images, grids = [], [], []
    for text, (rows, cols) in LAYOUT:
        types_ += [0] * text
        start = len(types_)
        types_ += [1] * (rows * cols)
        images.append(
            ImageInput(len(images), None, tuple(range(start, len(types_))), grid=(rows, cols))
        )
        grids.append((1, rows * MERGE, cols * MERGE))
    return types_ + [0] * 5, images, grids


def reference(token_types: list[int], grids: list[tuple[int, int, int]]) -> np.ndarray:
    vision = types.SimpleNamespace(spatial_merge_size=MERGE, tokens_per_second=2)
    model = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    model.get_vision_position_ids = types.MethodType(Qwen2_5_VLModel.get_vision_position_ids, model)
    ids = torch.zeros(1, len(token_types), dtype=torch.long)
    positions, _ = Qwen2_5_VLModel.get_rope_index(
        model, ids, torch.tensor([token_types]), image_grid_thw=torch.tensor(grids)
    )
    return positions[:, 0].numpy()


def test_whole_prompt_matches_transformers():
    token_types, images, grids = prompt()
    expected = reference(token_types, grids)
    assert np.array_equal(mrope_positions(images, 0, len(token_types)), expected)
    assert not np.array_equal(expected[1], expected[2])  # the grids do move the rows


@pytest.mark.parametrize("seed", range(4))
def test_chunks_from_any_start_match(seed):
    token_types, images, grids = prompt()
    expected = reference(token_types, grids)
    cuts = sorted(np.random.default_rng(seed).choice(len(token_types), 4, replace=False))
    bounds = [0, *cuts, len(token_types)]
    pieces = [
        mrope_positions([i for i in images if i.start < end], start, end)
        for start, end in zip(bounds, bounds[1:], strict=False)
    ]
    assert np.array_equal(np.concatenate(pieces, axis=1), expected)


def test_generated_tokens_go_on_from_the_last():
    token_types, images, grids = prompt()
    last = reference(token_types, grids)[:, -1]
    n = len(token_types)
    after = mrope_positions(images, n, n + 3)
    assert np.array_equal(after, np.tile(last[:, None] + np.arange(1, 4), (1, 1)))
