"""ImagePrompts: a vision model's prompt with its images in it. The chat template
writes one marker token per image (Idefics3's ``<image>``); each marker is replaced by
the tokens the image's embeddings take, as the model's own processor writes them for
the image's size (its tiles' placeholders, with the tokens around them), and the
image is preprocessed into the pixel values its vision tower takes.

The expansion starts and ends with special tokens, so tokenizing it alone gives the
tokens the whole expanded text gives (what transformers' processor tokenizes).
"""

from __future__ import annotations

import functools
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.multimodal.idefics3_images import Idefics3ImageProcessor, ProcessedImage
from hetero_infer.engine.params.image_input import ImageInput, content_hash
from hetero_infer.engine.settings.exceptions import ValidationError
from hetero_infer.engine.tokenizer import Tokenizer

# The preprocessed images kept for a next question about them: a SmolVLM image's 13
# tiles of 3 x 512 x 512 in fp32 are 40 MiB.
RECENT_IMAGES_BYTES = 256 << 20


class ImagePrompts:
    def __init__(
        self,
        processor: Idefics3ImageProcessor,
        encode: Callable[[str], list[int]],
        image_token_id: int,
    ) -> None:
        """``encode``: text -> token ids, without the tokenizer's own special tokens."""
        self.processor = processor
        self.image_token_id = image_token_id
        # Recently preprocessed images by content hash, least recently used first (the
        # server's routes may call from several threads).
        self._recent: OrderedDict[int, ProcessedImage] = OrderedDict()
        self._recent_bytes = 0
        self._lock = threading.Lock()
        self._placeholder_ids = lru_cache(maxsize=64)(
            lambda rows, cols: tuple(encode(processor.placeholder_text(rows, cols)))
        )

    @classmethod
    def for_model(
        cls, folder: Path, config: ModelConfig, tokenizer: Tokenizer
    ) -> ImagePrompts | None:
        """A vision model's, from its folder's preprocessing config; None for text only."""
        if config.vision is None:
            return None
        encode = functools.partial(tokenizer.encode, add_special_tokens=False)
        processor = Idefics3ImageProcessor.from_folder(folder)
        return cls(processor, encode, config.vision.image_token_id)

    def expand(
        self, token_ids: list[int], images: Sequence[Any], param: str
    ) -> tuple[list[int], tuple[ImageInput, ...]]:
        """The prompt's token ids with each marker replaced by its image's placeholder
        tokens, and the images as the engine carries them; a ValidationError naming
        ``param`` where markers and images do not pair up."""
        markers = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        if len(markers) != len(images):
            raise ValidationError(
                f"{param}: {len(images)} image(s) for {len(markers)} image place(s) in the "
                "prompt (the chat template writes one per image part; a text part may not "
                "spell the image token)",
                param=param,
            )
        expanded: list[int] = []
        inputs = []
        taken = 0
        for index, (marker, image) in enumerate(zip(markers, images, strict=True)):
            try:
                image_hash, processed = self.preprocess(image)
            except (ValueError, OSError) as exc:
                raise ValidationError(f"{param}: image {index}: {exc}", param=param) from exc
            placeholder = self._placeholder_ids(processed.rows, processed.cols)
            expanded += token_ids[taken:marker]
            ids = np.asarray(placeholder)
            positions = np.flatnonzero(ids == self.image_token_id) + len(expanded)
            expanded += placeholder
            taken = marker + 1
            inputs.append(ImageInput(image_hash, processed.pixel_values, tuple(positions.tolist())))
        expanded += token_ids[taken:]
        return expanded, tuple(inputs)

    def preprocess(self, image: Any) -> tuple[int, ProcessedImage]:
        """The image's content hash (of its RGB pixels: the processor's settings are the
        engine's, so equal pixels preprocess equally), and its preprocessed tiles, taken
        from the cache of recent images where it is there (a second question about an
        image costs no resizing). The server calls it on a worker thread as an image
        arrives, so that expand() on the event loop finds it done."""
        rgb = self.processor.to_rgb(image)
        image_hash = content_hash(rgb.tobytes() + struct.pack("<II", *rgb.size))
        with self._lock:
            processed = self._recent.get(image_hash)
            if processed is not None:
                self._recent.move_to_end(image_hash)
                return image_hash, processed
        processed = self.processor.process_rgb(rgb)
        with self._lock:
            self._recent[image_hash] = processed
            self._recent_bytes += processed.pixel_values.nbytes
            while self._recent_bytes > RECENT_IMAGES_BYTES and len(self._recent) > 1:
                _, dropped = self._recent.popitem(last=False)
                self._recent_bytes -= dropped.pixel_values.nbytes
        return image_hash, processed
