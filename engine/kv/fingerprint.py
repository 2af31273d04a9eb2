"""Whose KV a disk tier file holds: a digest of everything that shapes a block's bytes.

Two engines share files only where every input below agrees: the weights (their files'
names, sizes and modification times, and the model's config), the dtype the KV is kept
in, the quantization (it changes the activations, so the keys and values), the block
size and the KV layout (layers, KV heads, head size per group), how a key or value is
stored in those bytes (kv_quant.KV_FORMAT), and this file format; for a vision model,
its image processor's settings too (its folder's files and mm_processor_kwargs), which
shape an image's tokens.
A file written under another fingerprint lives in another folder, and its header
names its fingerprint too (block_file.py), so it is never read as this model's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hetero_infer.engine.kv.block_file import MAGIC
from hetero_infer.kernels import KV_FORMAT


def _weight_files(path: Path) -> list[dict[str, Any]]:
    files = (
        [path]
        if path.is_file()
        else sorted(path.glob("*.safetensors"))
        + sorted(path.glob("*.gguf"))
        + sorted(path.glob("*processor_config.json"))
    )
    out = []
    for f in files:
        stat = f.stat()
        out.append({"name": f.name, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return out


def kv_fingerprint(
    weights: Path,
    model_config: Any,
    dtype: str,
    quantization: str,
    block_size: int,
    group_layouts: list[tuple[int, int, int]],
    mm_processor_kwargs: dict[str, Any] | None = None,
) -> str:
    """A 32-hex-digit digest; ``group_layouts``: (layers, KV heads, head size) per KV
    cache group, global first."""
    described = {
        "format": MAGIC.hex(),
        "kv_format": KV_FORMAT,
        "weights": str(weights.resolve()),
        "files": _weight_files(weights),
        "model_config": repr(model_config),
        "dtype": dtype,
        "quantization": quantization,
        "block_size": block_size,
        "groups": group_layouts,
    }
    if mm_processor_kwargs:  # absent otherwise: the digests of earlier files stand
        described["mm_processor_kwargs"] = mm_processor_kwargs
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
