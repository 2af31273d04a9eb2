"""An image's bytes -> the decoded RGB picture the model's image processor takes
(decode_image), or a 400 naming the image's place in the body.

Decoding is where hostile bytes do harm: a small file can declare a huge picture (a
decompression bomb), so the size its header declares is checked before any pixel is
decoded, against a limit of our own (PIL's process-wide one only warns below twice
its value; above, its error is a 400 too). Only the common still-image formats are opened: each
format PIL reads is parser code an attacker can reach. It is CPU work: callers run it
on a thread (asyncio.to_thread), off the event loop.
"""

from __future__ import annotations

import io

from hetero_infer.server.errors import APIError
from PIL import Image, UnidentifiedImageError

# The formats taken (PIL's names), and how an error lists them.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
FORMAT_NAMES = "PNG, JPEG, WebP, GIF or BMP"
# The most pixels an image may declare: 40 megapixels (a 7,000 x 5,700 photo). Vision
# models scale every image down to a few megapixels at most, so more is only cost.
MAX_IMAGE_PIXELS = 40_000_000
# Pillow's blocks of image memory (PILLOW_BLOCK_SIZE; 16 MB by default, which splits a
# 2,000 x 2,000 picture) as large as the largest image taken, 4 bytes a pixel: each
# decoded image in one block, whose pixels the processors read without a copy
# (engine/multimodal/pillow_arrow.py). A block is as large as its image needs; Pillow
# takes sizes in whole pages.
PILLOW_BLOCK_BYTES = -(-4 * MAX_IMAGE_PIXELS // 4096) * 4096
Image.core.set_block_size(max(Image.core.get_block_size(), PILLOW_BLOCK_BYTES))


def decode_image(data: bytes, param: str, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """``data`` decoded (the first frame of an animation) as an RGB image; transparency
    is laid over white, as vLLM does, rather than dropped to whatever color it hid."""
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
        width, height = image.size
        if width * height > max_pixels:
            raise _bad(
                param, f"the image is too large: {width} x {height} pixels, more than {max_pixels}"
            )
        # The whole file to the decoder at once (it is in memory already), where PIL
        # reads 64 KB at a time and the JPEG decoder stops and restarts at each.
        image.decodermaxblock = max(len(data), image.decodermaxblock)
        image.load()  # the pixels: a file cut short fails here
        return _rgb(image)
    except UnidentifiedImageError:
        raise _bad(
            param, f"the data is not an image in a format this server reads ({FORMAT_NAMES})"
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # The warning is raised where warnings are errors (python -W error).
        raise _bad(param, "the image is too large (a decompression bomb)") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        # PIL's errors for a truncated or corrupt file: OSError ("image file is
        # truncated"), SyntaxError (a bad PNG chunk), EOFError, ValueError.
        raise _bad(param, f"the image cannot be decoded (truncated or corrupt: {exc})") from None


def _rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _bad(param: str, problem: str) -> APIError:
    return APIError(400, f"{param}: {problem}", param=param)
