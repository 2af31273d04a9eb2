"""A step's image embeddings: where each image's rows go among the step's tokens, and
the rows themselves, each image encoded once.

An image's embeddings are computed when a step first reaches one of its placeholder
tokens, for all of its tokens at once (the vision encoder sees the whole image), and
kept in an encoder cache keyed by the image's content hash: the later chunks of a
prompt that chunked prefill splits inside an image, a recomputed preempted sequence
and a second request about the same image all take them from there. The step's images
that miss are encoded in one call.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np
import torch
from hetero_infer.engine.models.protocol import CausalLM, ImageEmbeds
from hetero_infer.engine.models.vision_language import joined
from hetero_infer.engine.params.image_input import ImageInput

# The encoder cache's size: its least recently used images go first past it. An image
# of SmolVLM-256M (13 tiles of 64 rows of 576 values, fp32) is about 2 MB.
ENCODER_CACHE_BYTES = 256 << 20


class ImagePlacement(NamedTuple):
    """Which of an image's embedding rows a step computes, and at which of its rows."""

    image: ImageInput
    image_rows: np.ndarray  # indices into the image's embedding rows
    step_rows: np.ndarray  # the step's token rows they replace


def place_images(
    images: tuple[ImageInput, ...], start: int, end: int, first_row: int
) -> list[ImagePlacement]:
    """The placements of a chunk's images: the chunk computes positions [start, end),
    from the step's row ``first_row`` on."""
    placements = []
    for image in images:
        if not image.overlaps(start, end):  # before the chunk (M-RoPE's: core/sequence.py)
            continue
        positions = np.asarray(image.positions)
        taken = np.flatnonzero((positions >= start) & (positions < end))
        if taken.size:
            placements.append(ImagePlacement(image, taken, positions[taken] - start + first_row))
    return placements


def bidirectional_ends(placements: list[ImagePlacement], num_tokens: int) -> np.ndarray | None:
    """AttentionInputs.bidirectional_ends of a step with these placements: None where
    no image of theirs is bidirectional."""
    both_ways = [p for p in placements if p.image.bidirectional]
    if not both_ways:
        return None
    ends = np.zeros(num_tokens, np.int64)
    for placement in both_ways:
        ends[placement.step_rows] = placement.image.end
    return ends


class ImageEmbeddings:
    def __init__(self, model: CausalLM, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.cache: OrderedDict[int, torch.Tensor] = OrderedDict()  # content hash -> rows
        self.cached_bytes = 0

    def __call__(self, placements: list[ImagePlacement]) -> ImageEmbeds:
        """The step's image rows (which token rows, and their embeddings)."""
        self._encode_missing([p.image for p in placements])
        step_rows = np.concatenate([p.step_rows for p in placements])
        cache = self.cache
        rows = [cache[p.image.content_hash][torch.from_numpy(p.image_rows)] for p in placements]
        embeddings = joined(rows)
        return torch.from_numpy(step_rows).to(self.device), embeddings

    def _encode_missing(self, images: list[ImageInput]) -> None:
        by_hash = {image.content_hash: image for image in images}
        missing = [h for h in by_hash if h not in self.cache]
        for content_hash in by_hash.keys() - set(missing):
            self.cache.move_to_end(content_hash)  # recently used
        if not missing:
            return
        pixels = [by_hash[h].pixel_values.to(self.device) for h in missing]
        counts = [len(by_hash[h].positions) for h in missing]
        rows = self.model.encode_images(pixels)
        if rows.shape[0] != sum(counts):
            raise RuntimeError(
                f"the vision encoder gave {rows.shape[0]} rows for {sum(counts)} placeholders"
            )
        for content_hash, embeddings in zip(missing, rows.split(counts), strict=True):
            self.cache[content_hash] = embeddings
            self.cached_bytes += embeddings.nbytes
        # The least recently used images out, never this step's (the cache's newest).
        while self.cached_bytes > ENCODER_CACHE_BYTES and len(self.cache) > len(by_hash):
            _, dropped = self.cache.popitem(last=False)
            self.cached_bytes -= dropped.nbytes
