"""RecentImages: preprocessed images kept by content hash, least recently used dropped
first past the byte bound."""

from __future__ import annotations

import torch
from hetero_infer.engine.multimodal.pixels import ProcessedImage
from hetero_infer.engine.multimodal.recent_images import PreparedImage, RecentImages

TILE_BYTES = 3 * 4 * 4 * 4  # one float32 tile of 3 x 4 x 4


def image(content_hash: int) -> PreparedImage:
    return PreparedImage(content_hash, ProcessedImage(torch.zeros(1, 3, 4, 4), 0, 0))


def test_found_by_hash() -> None:
    recent = RecentImages()
    recent.add(image(1))
    assert recent.get(1).content_hash == 1
    assert recent.get(2) is None


def test_the_least_recently_used_go_first_past_the_bound() -> None:
    recent = RecentImages(max_bytes=2 * TILE_BYTES)
    recent.add(image(1))
    recent.add(image(2))
    assert recent.get(1) is not None  # 1 used again: 2 is the oldest now
    recent.add(image(3))
    assert recent.get(2) is None
    assert recent.get(1) is not None and recent.get(3) is not None
