"""Constrained decoding: llguidance matchers over the model's tokenizer.

Each constrained sequence has a matcher that knows which tokens may come next; the
sampler turns that into a vocabulary mask before it picks, and the engine feeds the
matcher every token picked. Why llguidance (not xgrammar): it computes each mask
lazily from the grammar with no per-schema compile step (a request's schema costs
nothing before its first token), has no Python dependencies, and its masks are
plain bit arrays that apply on any torch device. docs/server.md has its per-token cost.

A matcher is built from a JSON schema (response_format, tool calls) or from any of
vLLM's structured outputs (guided_decoding.py): a choice, a regex, a grammar, ...
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from hetero_infer.engine.params.guided_decoding import (
    StructuredOutputsParams,
    grammar_text,
    json_options,
)
from hetero_infer.engine.settings.exceptions import ValidationError

# llguidance compiles grammars recursively (a chain of $refs or of Lark rules a few
# thousand deep overflows an 8 MiB stack, killing the process), so compiles run on one
# thread of their own with this stack: a chain of ~45,000 compiles on it, more than
# the body and grammar limits let through. (Only touched pages are memory.)
COMPILE_STACK_BYTES = 512 * 1024 * 1024
# How many of the first tokens a grammar allows are tried when it is built (_build).
PROBE_TOKENS = 8
# The most items one parser row may hold (llguidance's default): so many alternatives
# of a rule (forced tools, anyOf branches) may be open at one point of the output.
MAX_ITEMS_IN_ROW = 2000


class StructuredOutput:
    """Builds matchers over one tokenizer (built once, on first use)."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        self._hf_tokenizer = hf_tokenizer
        self._vocab_size = vocab_size
        self._eos_token_ids = eos_token_ids
        self._lltokenizer: Any = None
        self._compiler: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def matcher(self, schema: dict[str, Any], param: str = "response_format") -> Any:
        """A fresh llguidance matcher for ``schema``; ValueError naming ``param`` (the
        request field the schema came from) if the schema is unusable."""
        import llguidance

        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(json_options(schema, None))
            )
        except (TypeError, ValueError) as exc:
            raise ValidationError(
                f"{param}: the schema is not usable: {exc}", param=param
            ) from None
        return self._compiled(
            grammar, param, "the schema", "no JSON value can be generated for the schema"
        )

    def guided_matcher(self, spec: StructuredOutputsParams, param: str) -> Any:
        """A fresh matcher for one of vLLM's structured outputs; ValueError naming
        ``param`` (the request field it came from) if it does not compile."""
        what = "the schema" if spec.kind in ("json", "structural_tag") else f"the {spec.kind}"
        try:
            grammar = grammar_text(spec)
        except (TypeError, ValueError, AssertionError) as exc:
            raise ValidationError(f"{param}: {what} is not usable: {exc}", param=param) from None
        return self._compiled(grammar, param, what, "no output can match")

    def _compiled(self, grammar: str, param: str, what: str, unsatisfiable: str) -> Any:
        # llguidance's default limits bound the work: a grammar too big for them (an enum
        # of 100,000 strings) is an error after ~0.2 s, and each token mask stops at its
        # fuel (~15 ms); catastrophic regexes cost nothing, as it matches by derivatives.
        tokenizer = self._tokenizer(param)
        built = self._executor().submit(_build, tokenizer, grammar, self._eos_token_ids).result()
        matcher, error, stage = built
        if stage == "compile":
            raise ValidationError(f"{param}: {what} is not usable: {error}", param=param)
        if stage == "first mask":
            # A grammar that nothing satisfies ($ref loops, an empty enum) compiles, and
            # fails at its first mask: here, rather than as a request that ends in "error".
            raise ValidationError(f"{param}: {unsatisfiable} ({error})", param=param)
        if stage == "first token":
            raise ValidationError(
                f"{param}: {what} cannot be followed past the first token of the output: "
                f"it has more alternatives at one point than the grammar engine takes "
                f"({MAX_ITEMS_IN_ROW}), or forces an output that never ends ({error})",
                param=param,
            )
        return matcher

    def _tokenizer(self, param: str) -> Any:
        if self._lltokenizer is None:
            import llguidance.hf

            if not getattr(self._hf_tokenizer, "is_fast", False):
                raise ValidationError(f"{param} needs a fast (tokenizers) tokenizer", param=param)
            self._lltokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer,
                n_vocab=self._vocab_size,
                eos_token=self._eos_token_ids or None,
            )
        return self._lltokenizer

    def _executor(self) -> ThreadPoolExecutor:
        """The compile thread, started with its large stack. stack_size() is process
        wide, so it is set only while that one thread starts."""
        with self._lock:
            if self._compiler is None:
                previous = threading.stack_size(COMPILE_STACK_BYTES)
                try:
                    compiler = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
                    compiler.submit(lambda: None).result()  # starts the thread now
                finally:
                    threading.stack_size(previous)
                self._compiler = compiler
            return self._compiler


def _build(
    tokenizer: Any, grammar: str, eos_token_ids: list[int]
) -> tuple[Any, str | None, str | None]:
    """On the compile thread: the matcher, its error (first line) and where the error
    came: at compiling, at the first mask, or at the first token (None: no error)."""
    import llguidance

    # llguidance's default limits, spelt out; errors without the parser's state and the
    # whole grammar (which the log of a request failing mid-generation would hold).
    limits = llguidance.LLParserLimits(max_items_in_row=MAX_ITEMS_IN_ROW, verbose_errors=False)
    matcher = llguidance.LLMatcher(tokenizer, grammar, limits=limits)
    if matcher.is_error():
        return matcher, _first_line(matcher.get_error()), "compile"
    bitmask = matcher.compute_bitmask()
    if matcher.is_error():
        return matcher, _first_line(matcher.get_error()), "first mask"
    error = _first_token_error(matcher, bitmask, eos_token_ids)
    if error is not None:
        return matcher, _first_line(error), "first token"
    return matcher, None, None


def _first_token_error(matcher: Any, bitmask: bytes, eos_token_ids: list[int]) -> str | None:
    """The error of the first of PROBE_TOKENS allowed first tokens after which the
    grammar fails, or None. A row of more than MAX_ITEMS_IN_ROW alternatives (2,500
    forced tools, an anyOf of 2,500 objects) or a loop the output is forced into (a
    required property that refers back to "#", ``start: "a" start``) gives a first
    mask but fails on the next token: stepping copies of the matcher over a few first
    tokens finds it here, for one mask each (cheap beside compiling), not as a request
    that fails in the middle of its generation. A failure that only a later token
    reaches is still possible; the routes report it as a failed generation."""
    mask_bytes = torch.frombuffer(bytearray(bitmask), dtype=torch.uint8)
    bits = (mask_bytes.unsqueeze(1) >> torch.arange(8, dtype=torch.uint8)) & 1
    allowed = bits.flatten().nonzero().flatten().tolist()
    probes = [token for token in allowed if token not in eos_token_ids][:PROBE_TOKENS]
    for token in probes:
        probe = matcher.deep_copy()
        if probe.consume_token(token) and not probe.is_error():
            probe.compute_bitmask()
        if probe.is_error():
            return probe.get_error()
    return None


def _first_line(error: str) -> str:
    """llguidance's message without the parser state it may append (but with the
    regex parser's "error: ..." line, which says what is wrong)."""
    lines = error.split("\n")
    detail = [line for line in lines[1:] if line.startswith("error: ")][:1]
    return " ".join([lines[0], *detail])


def bitmask_words(bitmask: bytes, vocab_size: int) -> torch.Tensor:
    """A matcher's compute_bitmask() -> [ceil(vocab / 32)] int32: bit b of word w allows
    token 32 w + b (the sampler's ``allowed`` rows)."""
    words = -(-vocab_size // 32)
    return torch.frombuffer(bytearray(bitmask[: 4 * words]), dtype=torch.int32)
