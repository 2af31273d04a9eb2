"""ImagePrompts: a vision model's prompt with its images in it. The chat template
writes one marker token per image (Idefics3's ``<image>``, Gemma 3's
``<start_of_image>``); each marker is replaced by the tokens the image's embeddings take,
as the model's own processor writes them for the image (its tiles' placeholders, with the
tokens around them), and the image is preprocessed into the pixel values its vision
tower takes.

The processor replaces the marker in the prompt's text and tokenizes the result; here
the prompt is token ids. The placeholder's core starts and ends with special tokens, so
tokenizing it alone gives the tokens the whole text gives. Text the processor puts
around it (Gemma 3's blank lines) joins the prompt's text beside the marker, up to the
nearest special token, and that stretch is tokenized again as a whole, as the
processor's text would be ("\n" + "\n\n" is one token, not two).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.multimodal.gemma3_images import Gemma3ImageProcessor
from hetero_infer.engine.multimodal.idefics3_images import Idefics3ImageProcessor
from hetero_infer.engine.multimodal.pixels import pixels_hash, pixels_of
from hetero_infer.engine.multimodal.qwen2_vl_images import Qwen2VLImageProcessor
from hetero_infer.engine.multimodal.recent_images import PreparedImage, RecentImages
from hetero_infer.engine.params.image_input import ImageInput, content_hash
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import ConfigError, ValidationError
from hetero_infer.engine.tokenizer import Tokenizer

# Each vision model's image processor, by architecture.
PROCESSORS = {
    "Idefics3ForConditionalGeneration": Idefics3ImageProcessor,
    "Gemma3ForConditionalGeneration": Gemma3ImageProcessor,
    "Qwen2_5_VLForConditionalGeneration": Qwen2VLImageProcessor,
}
ImageProcessor = Idefics3ImageProcessor | Gemma3ImageProcessor | Qwen2VLImageProcessor
# Hashed before an encoded file's digest, where that makes a content hash: such hashes
# then stand apart from those of pixels.
SOURCE_DIGEST = b"encoded file:"


class ImagePrompts:
    def __init__(
        self,
        processor: ImageProcessor,
        tokenizer: Tokenizer,
        image_token_id: int,
        bidirectional: bool = False,
        mrope: bool = False,
        processor_for: Callable[[Mapping[str, Any]], ImageProcessor] | None = None,
    ) -> None:
        """``image_token_id``: the token whose embeddings an image's replace;
        ``bidirectional``: whether an image's tokens attend to each other both ways;
        ``mrope``: whether they take M-RoPE's grid positions (the processor's grid of
        patches, merged by its merge_size); ``processor_for``: the processor with a
        request's mm_processor_kwargs (with_overrides; None: none taken)."""
        self.processor = processor
        self._processor_for = processor_for
        # Mixed into the content hashes of images preprocessed with a request's own
        # settings: to the prefix cache and the recent images, another image.
        self._salt = b""
        self.tokenizer = tokenizer
        self.image_token_id = image_token_id
        self.bidirectional = bidirectional
        self.mrope = mrope
        self.marker_id = _single_token(tokenizer, processor.marker)
        # The tokens that end a stretch of text, which the tokenizer matches alone: its
        # special added tokens (Gemma's added newline runs merge with their neighbours).
        hf = tokenizer.hf_tokenizer
        self._split_ids = (
            frozenset(i for i, token in hf.added_tokens_decoder.items() if token.special)
            if hf is not None
            else tokenizer.special_token_ids
        )
        self.recent = RecentImages()
        self._placeholder = lru_cache(maxsize=64)(self._placeholder_of_grid)

    @classmethod
    def for_model(
        cls, folder: Path, config: ModelConfig, tokenizer: Tokenizer, settings: EngineConfig
    ) -> ImagePrompts | None:
        """A vision model's, from its folder's preprocessing config; None for text only.
        Of the engine's ``settings``: cpu_kernels, whether the CPU kernels preprocess;
        mm_processor_kwargs over the folder's settings, of those by which the model's
        processor lets an image's size or values change (a ConfigError names any other:
        the encoder's input shape is the model's)."""
        engine_overrides = settings.mm_processor_kwargs or {}
        if config.vision is None:
            if engine_overrides:
                raise ConfigError("mm_processor_kwargs: this model takes no images")
            return None
        processor_class = PROCESSORS.get(config.architecture)
        if processor_class is None:
            raise ConfigError(f"{config.architecture}: no image processor for its images")

        def processor_for(overrides: Mapping[str, Any]) -> ImageProcessor:
            if not isinstance(overrides, Mapping):
                raise ConfigError(f"mm_processor_kwargs must be a JSON object, not {overrides!r}")
            if unknown := sorted(set(overrides) - processor_class.OVERRIDABLE):
                allowed = ", ".join(sorted(processor_class.OVERRIDABLE))
                raise ConfigError(
                    f"mm_processor_kwargs: {config.architecture}'s image processor takes no "
                    f"{', '.join(unknown)} here, only {allowed}"
                )
            try:
                processor = processor_class.from_folder(folder, {**engine_overrides, **overrides})
            except (TypeError, ValueError) as exc:  # a value of the wrong type or range
                # (named without the model's folder, which a client need not learn)
                raise ConfigError(f"mm_processor_kwargs: {exc}".replace(f"{folder}: ", "")) from exc
            return replace(processor, cpu_kernels=settings.cpu_kernels)

        vision, mrope = config.vision, config.mrope_section is not None
        processor = processor_for(engine_overrides)
        return cls(
            processor, tokenizer, vision.image_token_id, vision.bidirectional, mrope, processor_for
        )

    def with_overrides(self, overrides: Mapping[str, Any] | None) -> ImagePrompts:
        """These prompts with a request's mm_processor_kwargs (vLLM's field) over the
        engine's settings: the same tokenizer and recent images, their own processor and
        content hashes. A ConfigError names what the processor does not take, and
        settings that would resize an image past the engine's largest."""
        if not overrides:
            return self
        if self._processor_for is None:
            raise ConfigError("mm_processor_kwargs: these image prompts take none")
        processor = self._processor_for(overrides)
        if processor.largest_pixels > self.processor.largest_pixels:
            # A request may not make its images cost more than the server's settings do.
            raise ConfigError(
                "mm_processor_kwargs: an image may be made no larger than the server's "
                f"settings make it ({self.processor.largest_pixels} pixels)"
            )
        variant = copy.copy(self)
        variant.processor = processor
        variant._salt = json.dumps(overrides, sort_keys=True).encode()
        variant._placeholder = lru_cache(maxsize=64)(variant._placeholder_of_grid)
        return variant

    def expand(
        self, token_ids: list[int], images: Sequence[Any], param: str
    ) -> tuple[list[int], tuple[ImageInput, ...]]:
        """The prompt's token ids with each marker replaced by its image's placeholder
        tokens, and the images as the engine carries them (``images``: PIL images, or
        what preprocess made of them); a ValidationError naming ``param`` where markers
        and images do not pair up."""
        markers = [i for i, t in enumerate(token_ids) if t == self.marker_id]
        if len(markers) != len(images):
            raise ValidationError(
                f"{param}: {len(images)} image(s) for {len(markers)} image place(s) in the "
                "prompt (the chat template writes one per image part; a text part may not "
                "spell the image token)",
                param=param,
            )
        prepared = []
        for index, image in enumerate(images):
            try:
                ready = isinstance(image, PreparedImage)
                prepared.append(image if ready else self.preprocess(image))
            except (ValueError, OSError) as exc:
                raise ValidationError(f"{param}: image {index}: {exc}", param=param) from exc
        placeholders = [self._placeholder(p.processed.rows, p.processed.cols) for p in prepared]
        # The text between markers, with the placeholders' text on either side of it.
        bounds = [-1, *markers, len(token_ids)]
        expanded: list[int] = []
        inputs = []
        for index in range(len(bounds) - 1):
            after_previous = placeholders[index - 1][2] if index else ""
            before_next = placeholders[index][0] if index < len(markers) else ""
            between = token_ids[bounds[index] + 1 : bounds[index + 1]]
            expanded += self._joined(after_previous, between, before_next)
            if index == len(markers):
                break
            core = np.asarray(placeholders[index][1])
            positions = np.flatnonzero(core == self.image_token_id) + len(expanded)
            expanded += placeholders[index][1]
            image_hash, image = prepared[index].content_hash, prepared[index].processed
            grid = None
            if self.mrope:
                merge = self.processor.merge_size
                grid = (image.rows // merge, image.cols // merge)
            placed = tuple(positions.tolist())
            inputs.append(
                ImageInput(image_hash, image.pixel_values, placed, self.bidirectional, grid)
            )
        return expanded, tuple(inputs)

    def _placeholder_of_grid(self, rows: int, cols: int) -> tuple[str, tuple[int, ...], str]:
        """The text before an image's placeholder, its tokens, and the text after."""
        before, core, after = self.processor.placeholder_parts(rows, cols)
        return before, tuple(self.tokenizer.encode(core, add_special_tokens=False)), after

    def _joined(self, left: str, token_ids: list[int], right: str) -> list[int]:
        """``token_ids`` with ``left`` text before them and ``right`` after, tokenized as
        the processor's text is: the stretch up to the nearest split token again."""
        if not left and not right:
            return token_ids
        splits = [i for i, t in enumerate(token_ids) if t in self._split_ids]
        if not splits:  # one stretch of text from placeholder to placeholder
            return self._encode(left + self._decode(token_ids) + right)
        first, last = splits[0], splits[-1] + 1
        head, middle, tail = token_ids[:first], token_ids[first:last], token_ids[last:]
        if left:
            head = self._encode(left + self._decode(head))
        if right:
            tail = self._encode(self._decode(tail) + right)
        return head + middle + tail

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def preprocess(self, image: Any, source: bytes | None = None) -> PreparedImage:
        """The image's content hash and its preprocessed tiles, taken from the recent
        images where they are there (a second question about an image costs no
        resizing). ``source``: the digest of the bytes the image was decoded from, which
        makes its content hash (file_hash): the same bytes decode to the same pixels, so
        the pixels need no hashing (0.2 ms for 640 x 480). Without one, the hash is of
        the pixels (pixels_hash; under one processor's settings, equal pixels preprocess
        equally). The server calls this on a worker thread as an image arrives, and
        hands expand() the result."""
        rgb = self.processor.to_rgb(image)
        pixels = pixels_of(rgb)  # a view of Pillow's memory, where it exports one
        if source is not None:
            image_hash = self.file_hash(source)
        else:
            image_hash = self._salted(pixels_hash(pixels))
        prepared = self.recent.get(image_hash)
        if prepared is None:
            processed = self.processor.process_rgb(pixels)
            prepared = PreparedImage(image_hash, processed)
            self.recent.add(prepared)
        return prepared

    def file_hash(self, source: bytes) -> int:
        """The content hash of an image decoded from an encoded file whose bytes' digest
        is ``source`` (apart from pixel hashes by SOURCE_DIGEST)."""
        return self._salted(content_hash(SOURCE_DIGEST, source))

    def _salted(self, image_hash: int) -> int:
        if not self._salt:
            return image_hash
        return content_hash(self._salt, image_hash.to_bytes(8, "little"))


def _single_token(tokenizer: Tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ConfigError(f"the tokenizer spells the image marker {text!r} as {ids}, not one token")
    return ids[0]
