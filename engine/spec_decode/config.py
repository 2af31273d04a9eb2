"""SpeculativeConfig: vLLM's ``--speculative-config`` JSON, checked once at start-up.

    {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
     "prompt_lookup_min": 2}

Only n-gram (prompt lookup) speculation is implemented; a draft model (``"model"``) is
refused with a message that says so, as is any other key or value it cannot use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero_infer.engine.exceptions import ConfigError

METHODS = ("ngram",)
KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")
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
    method: str = "ngram"

    @classmethod
    def from_dict(cls, values: Any) -> SpeculativeConfig:
        """The checked config from its JSON object; a ConfigError names what is wrong."""
        if not isinstance(values, dict):
            raise ConfigError(f"{NAME} must be a JSON object, got {values!r}")
        if "model" in values:
            raise ConfigError(
                f"{NAME}: draft-model speculation ('model') is not supported yet; use "
                '{"method": "ngram", ...}'
            )
        for key in values:
            if key not in KEYS:
                raise ConfigError(f"{NAME}: unknown key {key!r} (known: {', '.join(KEYS)})")
        method = values.get("method", "ngram")
        if method not in METHODS:
            raise ConfigError(f"{NAME}: method must be one of {', '.join(METHODS)}, got {method!r}")
        if "num_speculative_tokens" not in values:
            raise ConfigError(f"{NAME}: num_speculative_tokens is required")
        k = values["num_speculative_tokens"]
        _check_int("num_speculative_tokens", k, 1, MAX_SPECULATIVE_TOKENS)
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

    def describe(self) -> str:
        return (
            f"speculative decoding: {self.method}, up to {self.num_speculative_tokens} draft "
            f"tokens from {self.prompt_lookup_max}- down to {self.prompt_lookup_min}-grams"
        )


def _check_int(name: str, value: Any, minimum: int, maximum: int | None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    if not ok or (maximum is not None and value > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{NAME}: {name} must be an integer {bound}, got {value!r}")
