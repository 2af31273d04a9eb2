"""Default sampling values from the model's generation_config.json, as vLLM's
``--generation-config`` and ``--override-generation-config`` give them.

A model's makers often recommend how to sample it (Qwen2.5: temperature 0.7, top_p
0.8, top_k 20, repetition_penalty 1.05) in the generation_config.json beside its
weights. The server uses those values for the fields a request leaves out; a request's
own values always win. The file's values are taken as written; ``do_sample`` and the
file's other keys are not read (vLLM reads the same six).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero_infer.engine.params.sampling_params import SamplingParams
from hetero_infer.engine.settings.exceptions import ConfigError

logger = logging.getLogger(__name__)

GENERATION_CONFIG_FILE = "generation_config.json"
# "auto": the model's own file; "vllm": none (the built-in defaults, vLLM's name for
# them). Anything else names a folder that holds the file.
GENERATION_MODES = ("auto", "vllm")
# generation_config.json's names -> SamplingParams fields.
SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


@dataclass(frozen=True)
class GenerationDefaults:
    # SamplingParams field -> value, for the fields a request leaves out.
    values: dict[str, Any] = field(default_factory=dict)
    # Where they came from (or why there are none), for the startup log.
    origin: str = "--generation-config vllm"

    @property
    def max_tokens(self) -> int | None:
        """The model's max_new_tokens: a request's max_tokens when it gives none."""
        return self.values.get("max_tokens")

    @property
    def sampling(self) -> dict[str, Any]:
        """The defaults other than max_tokens (which each route fits to the context)."""
        return {k: v for k, v in self.values.items() if k != "max_tokens"}

    def describe(self) -> str:
        if not self.values:
            return f"default sampling values: the built-in ones ({self.origin})"
        listed = ", ".join(f"{k}={v}" for k, v in sorted(self.values.items()))
        return f"default sampling values from {self.origin}: {listed} (a request's own win)"


def load_generation_defaults(
    mode: str,
    override: Mapping[str, Any] | None,
    model_folder: Path,
    packaged: Mapping[str, Any] | None = None,
) -> GenerationDefaults:
    """The defaults for ``mode`` ("auto", "vllm" or a folder) with ``override`` on top.

    "auto" reads ``model_folder``'s generation_config.json: a safetensors folder's, or
    the one beside a GGUF file (a GGUF file carries none inside it); without one, a
    packaged model's recommended values (``packaged``, as that file's keys), else none.
    A named folder must hold the file. Bad values are a ConfigError naming the file.
    """
    values: dict[str, Any] = {}
    sources: list[str] = []
    why_none = "--generation-config vllm"
    if mode != "vllm":
        folder = model_folder if mode == "auto" else Path(mode).expanduser()
        path = folder / GENERATION_CONFIG_FILE
        if path.is_file():
            values = _sampling_values(_read(path), str(path))
            if values:
                sources.append(str(path))
            why_none = f"{path} sets none"
        elif mode == "auto" and packaged:
            values = _sampling_values(packaged, "the packaged model's")
            sources.append("the packaged model's card")
        elif mode == "auto":
            why_none = f"no {GENERATION_CONFIG_FILE} in {folder}"
        else:
            raise ConfigError(f"generation_config: {str(folder)!r} has no {GENERATION_CONFIG_FILE}")
    if override:
        values.update(check_override(override))
        sources.append("--override-generation-config")
    return GenerationDefaults(values, " and ".join(sources) or why_none)


def check_override(override: Mapping[str, Any]) -> dict[str, Any]:
    """override_generation_config's values as SamplingParams fields; a ConfigError
    naming a key that is unknown or a value out of range."""
    name = "override_generation_config"
    if not isinstance(override, Mapping):
        raise ConfigError(f"{name}: expected a JSON object, got {override!r}")
    unknown = sorted(set(override) - set(SAMPLING_KEYS))
    if unknown:
        known = ", ".join(SAMPLING_KEYS)
        raise ConfigError(f"{name}: unknown key {unknown[0]!r}; it takes {known}")
    return _sampling_values(override, name)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def _sampling_values(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The six keys' values as SamplingParams fields (null ones left out), checked by
    SamplingParams itself so that a bad file fails at start, not in every request."""
    values = {
        SAMPLING_KEYS[key]: value
        for key, value in config.items()
        if key in SAMPLING_KEYS and value is not None
    }
    try:
        SamplingParams(**values)
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    return values
