"""engine/loader/gguf_metadata.py: a GGUF file's metadata is converted once, also when
processes ask for it at once (the others wait and take the first one's files)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from hetero_infer.engine.loader import gguf_metadata
from hetero_infer.engine.loader.source import ModelSource


def test_callers_at_once_convert_the_file_once(tmp_path, monkeypatch) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(gguf_metadata, "GGUF_METADATA_CACHE", tmp_path / "cache")
    conversions = []

    def slow_conversion(source: ModelSource, folder: Path) -> Path:
        conversions.append(source)
        time.sleep(0.2)  # long enough for every caller to ask before it ends
        folder.mkdir(parents=True)
        for name in ("config.json", "tokenizer_config.json"):
            (folder / name).write_text("{}")
        return folder

    monkeypatch.setattr(gguf_metadata, "_convert_metadata", slow_conversion)
    source = ModelSource(path=model, gguf_file=model.name)
    folders = []
    callers = [
        threading.Thread(target=lambda: folders.append(gguf_metadata.gguf_metadata_folder(source)))
        for _ in range(3)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert len(conversions) == 1
    assert len(set(folders)) == 1 and (folders[0] / "config.json").is_file()
    assert gguf_metadata.gguf_metadata_folder(source) == folders[0]
    assert len(conversions) == 1
