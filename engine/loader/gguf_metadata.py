"""A GGUF file's metadata converted by transformers into a config.json and tokenizer
files: once per file, kept under HF_HOME, and once for processes that start at once."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import transformers
import transformers.modeling_gguf_pytorch_utils as transformers_gguf
from hetero_infer.engine.loader.gguf_bulk_reader import bulk_gguf_reader
from hetero_infer.engine.loader.gguf_header import read_gguf_header
from hetero_infer.engine.loader.gguf_moe import moe_gguf_config
from hetero_infer.engine.loader.gguf_rope import phi3_rope_from_gguf
from hetero_infer.engine.loader.source import ModelSource
from huggingface_hub import constants as hf_constants
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

logger = logging.getLogger(__name__)

# Where the config and tokenizer converted from GGUF files are kept; a conversion of
# another version (ours: 2 reads Phi-3's RoPE settings) is not reused.
GGUF_METADATA_CACHE = Path(hf_constants.HF_HOME) / "hetero-paged-infer" / "gguf"
CONVERSION_VERSION = 2

# transformers' tokenizer classes that are not one family's own.
GENERIC_TOKENIZERS = {
    "TokenizersBackend",
    "PreTrainedTokenizerFast",
    "PythonBackend",
    "MistralCommonBackend",
}


def own_tokenizer_type(config: Any) -> str | None:
    """The config's model type where transformers maps it to a tokenizer class of its
    own (Gemma's, Qwen2's): named, AutoTokenizer takes that class at once, where from a
    GGUF file it would convert the file's config again to find it (for an architecture
    outside transformers' fast config table, reading the whole file once more). None for
    the generic backends, which AutoTokenizer picks by its own checks."""
    name = TOKENIZER_MAPPING_NAMES.get(config.model_type)
    return config.model_type if name and name not in GENERIC_TOKENIZERS else None


def gguf_metadata_folder(source: ModelSource) -> Path:
    """A folder with the GGUF file's config.json and tokenizer files.

    transformers' conversion of the file's metadata and vocab takes seconds (~2.5 s for
    SmolLM2's file, ~8 s for Gemma 3's 262k tokens), so the converted files are kept
    under HF_HOME, keyed by the file's path, size and mtime:
    later loads of the same file take well under a second.
    """
    stat = source.path.stat()
    key = f"{source.path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    key += f"|{CONVERSION_VERSION}"
    folder = GGUF_METADATA_CACHE / hashlib.sha256(key.encode()).hexdigest()[:20]
    if _converted(folder):
        return folder
    # Processes starting at once (a node's ranks, replicas, test workers) convert it
    # once: the others wait for the first and take its files.
    with _file_lock(folder.parent / f"{folder.name}.lock"):
        return folder if _converted(folder) else _convert_metadata(source, folder)


def _converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` between processes; none where it cannot be made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path, "a")  # noqa: SIM115
    except OSError:
        yield  # a read-only cache: each process converts for itself
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# One conversion at a time in a process while transformers' reader is swapped (two
# threads converting two files would each put back what the other swapped in).
_READ_ONCE_LOCK = threading.Lock()


@contextlib.contextmanager
def _metadata_read_once() -> Iterator[None]:
    """transformers reads a GGUF file's metadata whole (load_gguf_checkpoint: ~0.7 s for
    SmolLM2's file, 2.6 for Gemma 3's) for the config and again for the tokenizer: within
    this block the second read takes a copy of the first one's result."""
    with _READ_ONCE_LOCK:
        load = transformers_gguf.load_gguf_checkpoint
        read: dict[str, Any] = {}

        def load_once(path: str, return_tensors: bool = False, **kwargs: Any) -> Any:
            if return_tensors or kwargs:
                return load(path, return_tensors, **kwargs)
            if path not in read:
                read[path] = load(path)
            return copy.deepcopy(read[path])  # the callers change what they are given

        transformers_gguf.load_gguf_checkpoint = load_once
        try:
            yield
        finally:
            transformers_gguf.load_gguf_checkpoint = load


def _convert_metadata(source: ModelSource, folder: Path) -> Path:
    start = time.perf_counter()
    kwargs = {"gguf_file": source.gguf_file}
    # A mixture-of-experts file's config is ours (gguf_moe.py); its tokenizer then
    # comes without transformers' config, which it has none of for some of them.
    config = moe_gguf_config(source.path)
    if config is None:
        with _metadata_read_once(), bulk_gguf_reader():
            config = transformers.AutoConfig.from_pretrained(source.folder, **kwargs)
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                source.folder, tokenizer_type=own_tokenizer_type(config), **kwargs
            )
        if config.model_type == "phi3":
            phi3_rope_from_gguf(read_gguf_header(source.path), config)
    else:
        with bulk_gguf_reader():
            tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(
                source.folder, **kwargs
            )
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent))
    except OSError as exc:
        # A read-only cache is slower, not fatal.
        logger.warning("cannot cache GGUF metadata under %s: %s", folder.parent, exc)
        staging = Path(tempfile.mkdtemp())
    config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        os.replace(staging, folder)
    except OSError:
        # Another process cached it first, or the cache is read-only.
        if not _converted(folder):
            return staging
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("converted GGUF config and tokenizer in %.1f s", time.perf_counter() - start)
    return folder
