"""SpeculativeConfig: vLLM's ``--speculative-config`` JSON, checked once at start-up.

    {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
     "prompt_lookup_min": 2}
    {"model": "path/to/small-model", "num_speculative_tokens": 4}
    {"method": "ngram", "num_speculative_tokens": 5, "disable_by_batch_size": 8}

Two methods: n-gram (prompt lookup) guesses from earlier text; a draft model (``"model"``,
``"method": "draft_model"`` or no method) is a small model with the target's vocabulary
that guesses autoregressively. ``disable_by_batch_size`` (either method, as in vLLM)
turns drafting off in steps with more running requests than that: a big batch's step
already does all the work the cores can, and drafts would only add to it. Any other
key or value is refused with a message that names it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hetero_infer.engine.settings.choices import QUANTIZATIONS
from hetero_infer.engine.settings.exceptions import ConfigError

NGRAM = "ngram"
DRAFT_MODEL = "draft_model"
METHODS = (NGRAM, DRAFT_MODEL)
NGRAM_KEYS = ("prompt_lookup_max", "prompt_lookup_min")
DRAFT_KEYS = ("model", "quantization")
KEYS = ("method", "num_speculative_tokens", "disable_by_batch_size", *NGRAM_KEYS, *DRAFT_KEYS)
# More drafts than this cost more to verify than they could save at any acceptance.
MAX_SPECULATIVE_TOKENS = 16
# The n-gram lengths used when the config gives neither bound.
DEFAULT_LOOKUP_MIN = 2
DEFAULT_LOOKUP_MAX = 4
NAME = "speculative_config"


@dataclass(frozen=True)
class SpeculativeConfig:
    num_speculative_tokens: int
    prompt_lookup_min: int = DEFAULT_LOOKUP_MIN
    prompt_lookup_max: int = DEFAULT_LOOKUP_MAX
    method: str = NGRAM
    # The draft model (a folder, a .gguf file, a hub id, or "default" for the embedded
    # model) and how its weights are kept; only for method "draft_model".
    model: str | None = None
    quantization: str = "auto"
    # More running requests than this: no drafts (None: drafts at any batch size).
    disable_by_batch_size: int | None = None

    @property
    def uses_draft_model(self) -> bool:
        return self.method == DRAFT_MODEL

    @classmethod
    def from_dict(cls, values: Any) -> SpeculativeConfig:
        """The checked config from its JSON object; a ConfigError names what is wrong."""
        if not isinstance(values, dict):
            raise ConfigError(f"{NAME} must be a JSON object, got {values!r}")
        for key in values:
            if key not in KEYS:
                raise ConfigError(f"{NAME}: unknown key {key!r} (known: {', '.join(KEYS)})")
        # vLLM's form: a "model" with no method means a draft model.
        method = values.get("method", DRAFT_MODEL if "model" in values else NGRAM)
        if method not in METHODS:
            raise ConfigError(f"{NAME}: method must be one of {', '.join(METHODS)}, got {method!r}")
        if "num_speculative_tokens" not in values:
            raise ConfigError(f"{NAME}: num_speculative_tokens is required")
        k = values["num_speculative_tokens"]
        _check_int("num_speculative_tokens", k, 1, MAX_SPECULATIVE_TOKENS)
        limit = values.get("disable_by_batch_size")
        if limit is not None:
            _check_int("disable_by_batch_size", limit, 1, None)
        return dataclasses.replace(cls._method(values, method, k), disable_by_batch_size=limit)

    @classmethod
    def _method(cls, values: dict[str, Any], method: str, k: int) -> SpeculativeConfig:
        if method == DRAFT_MODEL:
            return cls._draft_model(values, k)
        for key in DRAFT_KEYS:
            if key in values:
                raise ConfigError(f"{NAME}: {key!r} is for method {DRAFT_MODEL!r}, not {method!r}")
        low, high = values.get("prompt_lookup_min"), values.get("prompt_lookup_max")
        for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            if value is not None:
                _check_int(name, value, 1, None)
        # One bound given: the other follows it, so that min <= max still holds.
        if low is None:
            low = min(DEFAULT_LOOKUP_MIN, high) if high is not None else DEFAULT_LOOKUP_MIN
        if high is None:
            high = max(DEFAULT_LOOKUP_MAX, low)
        if low > high:
            raise ConfigError(
                f"{NAME}: prompt_lookup_min ({low}) must not exceed prompt_lookup_max ({high})"
            )
        return cls(k, low, high, method)

    @classmethod
    def _draft_model(cls, values: dict[str, Any], k: int) -> SpeculativeConfig:
        model = values.get("model")
        if not isinstance(model, str) or not model:
            raise ConfigError(
                f"{NAME}: method {DRAFT_MODEL!r} needs 'model', the draft model's folder, "
                f'.gguf file or hub id ("default": the embedded model), got {model!r}'
            )
        for key in NGRAM_KEYS:
            if key in values:
                raise ConfigError(f"{NAME}: {key!r} is for method {NGRAM!r}, not {DRAFT_MODEL!r}")
        quantization = values.get("quantization", "auto")
        if quantization not in QUANTIZATIONS:
            raise ConfigError(
                f"{NAME}: quantization must be one of {', '.join(QUANTIZATIONS)}, "
                f"got {quantization!r}"
            )
        return cls(k, method=DRAFT_MODEL, model=model, quantization=quantization)

    def describe(self) -> str:
        if self.uses_draft_model:
            text = (
                f"speculative decoding: up to {self.num_speculative_tokens} draft tokens "
                f"from the draft model {self.model}"
            )
        else:
            text = (
                f"speculative decoding: {self.method}, up to {self.num_speculative_tokens} "
                f"draft tokens from {self.prompt_lookup_max}- down to "
                f"{self.prompt_lookup_min}-grams"
            )
        if self.disable_by_batch_size is not None:
            text += f", off above {self.disable_by_batch_size} running requests"
        return text


def _check_int(name: str, value: Any, minimum: int, maximum: int | None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    if not ok or (maximum is not None and value > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{NAME}: {name} must be an integer {bound}, got {value!r}")
