"""engine/multimodal/image_prompts.py: a prompt's image markers grow into the tokens the
model's processor gives, which tokenizes the text with the placeholders written in.
Gemma 3's placeholder brings blank lines that join the text beside the marker: with
Gemma's own tokenizer "\\n" + "\\n\\n" is one token, and the test tokenizer starts each
stretch of text between special tokens with "▁"; both must come out as the text's."""

from __future__ import annotations

import io

import blake3
import numpy as np
import pytest
from hetero_infer.engine.loader import load_tokenizer, resolve_model
from hetero_infer.engine.multimodal.gemma3_images import Gemma3ImageProcessor
from hetero_infer.engine.multimodal.image_prompts import ImagePrompts
from hetero_infer.engine.settings.exceptions import ValidationError
from hetero_infer.engine.tokenizer import Tokenizer
from PIL import Image

from tests.helpers import make_byte_fallback_tokenizer

PROCESSOR = Gemma3ImageProcessor(image_seq_length=4, height=8, width=8)
BOI = PROCESSOR.marker
# Markers beside newlines, at the text's edges, side by side, beside other special tokens.
TEXTS = [
    f"<bos><start_of_turn>user\n{BOI}What is this?<end_of_turn>\n<start_of_turn>model\n",
    f"<bos>{BOI}\nAfter a newline.\n\n",
    f"<bos>Two:{BOI}{BOI} side by side, then one at the end.{BOI}",
    f"<bos><start_of_turn>user\n\n{BOI}<end_of_turn>{BOI}<start_of_turn>",
]


def gemma_tokenizer():
    tokenizer = load_tokenizer(resolve_model("gemma-3-270m"))  # the text model's: no soft token
    tokenizer.add_special_tokens({"additional_special_tokens": [PROCESSOR.image_token]})
    return tokenizer


def byte_fallback_tokenizer():
    tokenizer = make_byte_fallback_tokenizer()
    tokens = ["<start_of_turn>", "<end_of_turn>", BOI, PROCESSOR.eoi_token, PROCESSOR.image_token]
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    return tokenizer


@pytest.fixture(scope="module", params=["gemma", "byte_fallback"])
def hf_tokenizer(request):
    if request.param == "gemma":
        return gemma_tokenizer()
    tokenizer = byte_fallback_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<bos>"]})
    return tokenizer


def image(seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (10, 12, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize("text", TEXTS)
def test_expansion_is_the_processors_text_tokenized(hf_tokenizer, text):
    tokenizer = Tokenizer(hf_tokenizer)
    image_token_id = hf_tokenizer.convert_tokens_to_ids(PROCESSOR.image_token)
    prompts = ImagePrompts(PROCESSOR, tokenizer, image_token_id, bidirectional=True)
    before, core, after = PROCESSOR.placeholder_parts()
    expected = hf_tokenizer.encode(
        text.replace(BOI, before + core + after), add_special_tokens=False
    )
    images = [image(i) for i in range(text.count(BOI))]
    token_ids = hf_tokenizer.encode(text, add_special_tokens=False)
    expanded, inputs = prompts.expand(token_ids, images, "messages")
    assert expanded == expected
    soft = np.flatnonzero(np.asarray(expanded) == image_token_id).reshape(len(images), 4)
    assert [list(i.positions) for i in inputs] == soft.tolist()
    assert all(i.bidirectional for i in inputs)


def test_markers_and_images_must_pair_up(hf_tokenizer):
    tokenizer = Tokenizer(hf_tokenizer)
    prompts = ImagePrompts(PROCESSOR, tokenizer, 0)
    token_ids = hf_tokenizer.encode(TEXTS[0], add_special_tokens=False)
    with pytest.raises(ValidationError, match=r"2 image\(s\) for 1 image place"):
        prompts.expand(token_ids, [image(0), image(1)], "messages")


def file_bytes(picture: Image.Image, file_format: str) -> bytes:
    out = io.BytesIO()
    picture.save(out, format=file_format)
    return out.getvalue()


def test_an_images_content_hash_is_its_files_or_else_its_pixels():
    """A file's image is known by its bytes' digest (the same bytes decode to the same
    pixels: no hashing of pixels), a decoded one by its pixels."""
    prompts = ImagePrompts(PROCESSOR, Tokenizer(byte_fallback_tokenizer()), 0)
    picture = image(3)

    def from_file(data: bytes) -> int:
        digest = blake3.blake3(data).digest()
        return prompts.preprocess(Image.open(io.BytesIO(data)), digest).content_hash

    png, bmp = file_bytes(picture, "PNG"), file_bytes(picture, "BMP")  # the same pixels
    assert from_file(png) == from_file(png)
    assert len({from_file(png), from_file(bmp), prompts.preprocess(picture).content_hash}) == 3
    assert (
        prompts.preprocess(picture.copy()).content_hash == prompts.preprocess(picture).content_hash
    )
    assert from_file(file_bytes(image(4), "PNG")) != from_file(png)
