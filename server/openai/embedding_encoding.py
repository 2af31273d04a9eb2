"""An embedding's bytes as vLLM encodes them for base64 and its binary answers: the fp32
vector rounded to ``embed_dtype`` (float32, float16, bfloat16 or an fp8 format), each
value's bytes in the order ``endianness`` asks for ("native": this machine's)."""

from __future__ import annotations

import sys
from typing import Literal

import torch

EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
Endianness = Literal["native", "big", "little"]

_DTYPES: dict[str, tuple[torch.dtype, torch.dtype]] = {
    # the dtype, and an integer one of its width whose numpy view can swap bytes
    "float32": (torch.float32, torch.int32),
    "float16": (torch.float16, torch.int16),
    "bfloat16": (torch.bfloat16, torch.int16),
    "fp8_e4m3": (torch.float8_e4m3fn, torch.uint8),
    "fp8_e5m2": (torch.float8_e5m2, torch.uint8),
}


def embedding_bytes(vector: list[float], embed_dtype: EmbedDType, endianness: Endianness) -> bytes:
    """The vector's values, rounded to ``embed_dtype`` (to nearest), as bytes."""
    dtype, bits = _DTYPES[embed_dtype]
    values = torch.tensor(vector, dtype=torch.float32).to(dtype).view(bits).numpy()
    if endianness not in ("native", sys.byteorder):
        values = values.byteswap()
    return values.tobytes()
