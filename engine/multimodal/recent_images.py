"""RecentImages: the images a vision model preprocessed lately, kept for a next question
about them. Found by content hash (of the RGB pixels, as the prefix cache knows an
image), and by the digest of the bytes an image came as (its PNG or JPEG file): a chat
client sends its images again with every turn, and the same bytes need no decoding and
no hashing of their pixels again. Bounded by the preprocessed pixels' bytes; safe to use
from several threads (the server preprocesses images on worker threads)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from hetero_infer.engine.multimodal.pixels import ProcessedImage

# The preprocessed images kept: a SmolVLM image's 13 tiles of 3 x 512 x 512 in fp32 are
# 40 MiB.
RECENT_IMAGES_BYTES = 256 << 20
# The sources remembered, a digest and a hash each: far more than the images kept.
MAX_SOURCES = 4096


@dataclass(frozen=True)
class PreparedImage:
    """An image ready for a prompt: its content hash and its preprocessed tiles."""

    content_hash: int
    processed: ProcessedImage


class RecentImages:
    def __init__(self, max_bytes: int = RECENT_IMAGES_BYTES) -> None:
        # Least recently used first.
        self._by_hash: OrderedDict[int, ProcessedImage] = OrderedDict()
        self._hash_of_source: OrderedDict[bytes, int] = OrderedDict()
        self._bytes = 0
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def get(self, content_hash: int) -> PreparedImage | None:
        with self._lock:
            return self._get(content_hash)

    def of_source(self, source: bytes) -> PreparedImage | None:
        """The image last added with ``source`` (a digest of its encoded bytes), where its
        preprocessed tiles are still kept."""
        with self._lock:
            content_hash = self._hash_of_source.get(source)
            if content_hash is None:
                return None
            self._hash_of_source.move_to_end(source)
            return self._get(content_hash)

    def add(self, image: PreparedImage, source: bytes | None = None) -> None:
        with self._lock:
            if source is not None:
                self._hash_of_source[source] = image.content_hash
                self._hash_of_source.move_to_end(source)
                if len(self._hash_of_source) > MAX_SOURCES:
                    self._hash_of_source.popitem(last=False)
            if image.content_hash in self._by_hash:
                return
            self._by_hash[image.content_hash] = image.processed
            self._bytes += image.processed.pixel_values.nbytes
            while self._bytes > self._max_bytes and len(self._by_hash) > 1:
                _, dropped = self._by_hash.popitem(last=False)
                self._bytes -= dropped.pixel_values.nbytes

    def _get(self, content_hash: int) -> PreparedImage | None:
        processed = self._by_hash.get(content_hash)
        if processed is None:
            return None
        self._by_hash.move_to_end(content_hash)
        return PreparedImage(content_hash, processed)
