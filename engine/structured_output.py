"""JSON output by constrained decoding: llguidance matchers over the model's tokenizer.

Each constrained sequence has a matcher that knows which tokens may come next; the
sampler turns that into a vocabulary mask before it picks, and the engine feeds the
matcher every token picked. Why llguidance (not xgrammar): it computes each mask
lazily from the grammar with no per-schema compile step (a request's schema costs
nothing before its first token), has no Python dependencies, and its masks are
plain bit arrays that apply on any torch device. docs/server.md has its per-token cost.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import torch
from hetero_infer.engine.exceptions import ValidationError

# Compact JSON: without this the grammar lets a model pad with endless whitespace.
_JSON_OPTIONS = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


class StructuredOutput:
    """Builds matchers for JSON schemas over one tokenizer (built once, on first use)."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        self._hf_tokenizer = hf_tokenizer
        self._vocab_size = vocab_size
        self._eos_token_ids = eos_token_ids
        self._lltokenizer: Any = None

    def matcher(self, schema: dict[str, Any], param: str = "response_format") -> Any:
        """A fresh llguidance matcher for ``schema``; ValueError naming ``param`` (the
        request field the schema came from) if the schema is unusable."""
        import llguidance

        if self._lltokenizer is None:
            import llguidance.hf

            if not getattr(self._hf_tokenizer, "is_fast", False):
                raise ValidationError(f"{param} needs a fast (tokenizers) tokenizer", param=param)
            self._lltokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer,
                n_vocab=self._vocab_size,
                eos_token=self._eos_token_ids or None,
            )
        schema = copy.deepcopy(schema)
        schema.setdefault("x-guidance", _JSON_OPTIONS)
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        except (TypeError, ValueError) as exc:
            raise ValidationError(
                f"{param}: the schema is not usable: {exc}", param=param
            ) from None
        # llguidance's default limits bound the work: a grammar too big for them (an enum
        # of 100,000 strings) is an error after ~0.2 s, and each token mask stops at its
        # fuel (~15 ms); catastrophic regexes cost nothing, as it matches by derivatives.
        matcher = llguidance.LLMatcher(self._lltokenizer, grammar)
        if matcher.is_error():
            raise ValidationError(
                f"{param}: the schema is not usable: {_first_line(matcher.get_error())}",
                param=param,
            )
        # A schema that no value satisfies ($ref loops, an empty enum) compiles, and
        # fails at its first mask: here, rather than as a request that ends in "error".
        matcher.compute_bitmask()
        if matcher.is_error():
            raise ValidationError(
                f"{param}: no JSON value can be generated for the schema "
                f"({_first_line(matcher.get_error())})",
                param=param,
            )
        return matcher


def _first_line(error: str) -> str:
    """llguidance's message without the parser state it may append."""
    return error.split("\n", 1)[0]


def bitmask_words(bitmask: bytes, vocab_size: int) -> torch.Tensor:
    """A matcher's compute_bitmask() -> [ceil(vocab / 32)] int32: bit b of word w allows
    token 32 w + b (the sampler's ``allowed`` rows)."""
    words = -(-vocab_size // 32)
    return torch.frombuffer(bytearray(bitmask[: 4 * words]), dtype=torch.int32)
