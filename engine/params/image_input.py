"""ImageInput: one image of a request, as the engine carries it from the input
processor (engine/multimodal/ made its pixels and placeholder tokens) to the runner,
which puts the image's embeddings at those tokens' positions.

Its content hash stands for the image in the prefix cache: a block holding any of its
placeholder tokens hashes it with the tokens (core/block_manager.py), so a second
question about the same image reuses the image's KV and a different image behind the
same placeholder tokens never does. The runner's encoder cache is keyed by it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import blake3


@dataclass(frozen=True, eq=False)
class ImageInput:
    # 64 bits of a hash of its RGB pixels and size (the engine has one preprocessing, so
    # equal pixels make equal tiles; the same picture resized is another image).
    content_hash: int
    pixel_values: Any  # the image processor's tensor, e.g. [tiles, 3, height, width]
    # The prompt positions its embedding rows take, in the rows' order.
    positions: tuple[int, ...]
    # Whether its tokens, one run, attend to each other both ways (Gemma 3's): a step
    # computes them all at once (Sequence.chunk_tokens), each seeing the whole image.
    bidirectional: bool = False
    # M-RoPE's (Qwen2-VL's): its tokens as rows x cols of the image, row by row, each
    # placed at (time, height, width) = (p, p + row, p + col) from the position p where
    # the image starts; the text after it goes on from p + max(rows, cols). None: its
    # tokens take positions as text does.
    grid: tuple[int, int] | None = None

    @property
    def start(self) -> int:
        """The position of its first placeholder token."""
        return self.positions[0]

    @property
    def end(self) -> int:
        """One past the position of its last placeholder token."""
        return self.positions[-1] + 1

    def overlaps(self, start: int, end: int) -> bool:
        """Whether any of its placeholder tokens lies in [start, end)."""
        return self.start < end and start < self.end


def content_hash(*parts: bytes | memoryview) -> int:
    """64 bits of the BLAKE3 hash of an image's bytes, ``parts`` in order: BLAKE3 (as
    vLLM's multimodal hasher) read a 640x480 image's pixels in 0.1 ms where SHA-256 took
    0.5 (on an AMD EPYC's SHA extensions) and BLAKE2b 0.8."""
    digest = blake3.blake3()
    for part in parts:
        digest.update(part)
    return int.from_bytes(digest.digest()[:8], "little")
