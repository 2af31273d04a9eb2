"""RecentImages: the images a vision model preprocessed lately, kept for a next question
about them, by content hash (as the prefix cache knows an image). An image decoded from
a file is known by its bytes' digest (ImagePrompts.file_hash): a chat client sends its
images again with every turn, and the same bytes are found without being decoded.
Bounded by the preprocessed pixels' bytes; safe to use from several threads (the server
preprocesses images on worker threads)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from hetero_infer.engine.multimodal.pixels import ProcessedImage

# The preprocessed images kept: a SmolVLM image's 13 tiles of 3 x 512 x 512 in fp32 are
# 40 MiB.
RECENT_IMAGES_BYTES = 256 << 20


@dataclass(frozen=True)
class PreparedImage:
    """An image ready for a prompt: its content hash and its preprocessed tiles."""

    content_hash: int
    processed: ProcessedImage


class RecentImages:
    def __init__(self, max_bytes: int = RECENT_IMAGES_BYTES) -> None:
        # Least recently used first.
        self._by_hash: OrderedDict[int, ProcessedImage] = OrderedDict()
        self._bytes = 0
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def get(self, content_hash: int) -> PreparedImage | None:
        with self._lock:
            processed = self._by_hash.get(content_hash)
            if processed is None:
                return None
            self._by_hash.move_to_end(content_hash)
            return PreparedImage(content_hash, processed)

    def add(self, image: PreparedImage) -> None:
        with self._lock:
            if image.content_hash in self._by_hash:
                return
            self._by_hash[image.content_hash] = image.processed
            self._bytes += image.processed.pixel_values.nbytes
            while self._bytes > self._max_bytes and len(self._by_hash) > 1:
                _, dropped = self._by_hash.popitem(last=False)
                self._bytes -= dropped.pixel_values.nbytes
