"""kv_fingerprint: whose KV a disk tier's files hold. Every input that shapes a block's
bytes moves it; so does what shapes an image's tokens (its processor's settings: the
folder's files and mm_processor_kwargs), and nothing else does."""

from __future__ import annotations

import os
from pathlib import Path

from hetero_infer.engine.kv.fingerprint import kv_fingerprint

LAYOUT = [(2, 4, 16)]


def fingerprint(folder: Path, **changes) -> str:
    args = {
        "weights": folder, "model_config": "tiny", "dtype": "float32", "quantization": "none",
        "block_size": 16, "group_layouts": LAYOUT, **changes,
    }  # fmt: skip
    return kv_fingerprint(**args)


def test_what_shapes_a_blocks_bytes_or_an_images_tokens_moves_it(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"w" * 8)
    (tmp_path / "notes.txt").write_text("not read")
    base = fingerprint(tmp_path)
    assert fingerprint(tmp_path, mm_processor_kwargs=None) == base
    assert fingerprint(tmp_path, mm_processor_kwargs={}) == base
    changed = [
        fingerprint(tmp_path, dtype="bfloat16"),
        fingerprint(tmp_path, block_size=32),
        fingerprint(tmp_path, group_layouts=[(2, 4, 32)]),
        fingerprint(tmp_path, mm_processor_kwargs={"max_pixels": 1003520}),
    ]
    assert len({base, *changed}) == 1 + len(changed)
    (tmp_path / "notes.txt").write_text("still not read")
    assert fingerprint(tmp_path) == base
    config = tmp_path / "preprocessor_config.json"
    config.write_text('{"max_pixels": 1003520}')
    with_config = fingerprint(tmp_path)
    assert with_config != base
    os.utime(config, ns=(0, 0))  # the file edited: another modification time
    assert fingerprint(tmp_path) != with_config
