"""The seed's config.json layout beside the engine's settings: the sections that
belong to the server, its names for two settings, the keys it had that mean nothing
here, and its tokenizer section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetero_infer.engine.settings.exceptions import ConfigError

# Sections of the seed's config.json that belong to the server (server/cli.py reads them).
SERVER_SECTIONS = ("serving",)
# Keys users of the seed APIs write (see EngineConfig's InitVars).
ALIASES = {"max_total_tokens": "max_num_batched_tokens", "max_batch_size": "max_num_seqs"}
# Keys of the seed's config.json with no meaning here: refused, saying why.
UNSUPPORTED_SEED_KEYS = {
    "max_retry_attempts": "a failed step is not retried: it fails its requests",
    "special_tokens": "special token ids come from the model's tokenizer",
}


def engine_settings(path: Path) -> dict[str, Any]:
    """A config file's engine settings: the whole JSON object, or its "engine" section,
    without "_comment" keys and the server's sections."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level")
    if isinstance(data.get("engine"), dict):
        data = data["engine"]
    return {k: v for k, v in data.items() if not k.startswith("_") and k not in SERVER_SECTIONS}


def read_section(path: str | Path, section: str) -> dict[str, Any]:
    """One section of a config file (e.g. the seed's "serving"); {} when it has none.
    The file was already read and checked by engine_settings."""
    data = json.loads(Path(path).read_text())
    value = data.get(section) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def seed_tokenizer(spec: dict[str, Any], source: str) -> str | None:
    """The seed's tokenizer section -> a tokenizer source (None: the model's own)."""
    kind, path = spec.get("kind", "huggingface"), spec.get("path")
    if set(spec) - {"kind", "path"} or kind not in ("huggingface", "simple"):
        raise ConfigError(f"{source}: tokenizer must be {{'kind': 'huggingface', 'path': ...}}")
    if kind == "simple":
        raise ConfigError(
            f"{source}: tokenizer kind 'simple' (the seed's test tokenizer) does not fit a real "
            "model: give 'huggingface' with a path (or null for the model's own), or pass a "
            "tokenizer object to the engine"
        )
    return path
