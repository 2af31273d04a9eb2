"""Tokenizer: a thin wrapper over a Hugging Face tokenizer, and the incremental detokenizer.

The engine only ever sees token ids; this module is where text goes in (encode, chat
template) and where it comes back out, one streamed delta at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import jinja2
from hetero_infer.engine.exceptions import ConfigError, ValidationError
from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# How many prompt tokens the detokenizer's first window reaches back (vLLM uses the same
# number): enough context for the first output token to decode as it would after the
# prompt, e.g. a Metaspace "▁word" keeps its space instead of being stripped as a start.
INITIAL_CONTEXT_TOKENS = 5

# A UTF-8 character is at most 4 bytes, so a character still being completed lies in the
# last 3 tokens that carry bytes. Text held back behind more tokens than this can only end
# in bytes that are invalid for good, so part of it may go out.
MAX_PARTIAL_CHAR_TOKENS = 3

# Drop consumed ids once this many sit before the window, so memory stays O(window).
_COMPACT_AFTER = 64

_REPLACEMENT_CHAR = "\ufffd"


class Tokenizer:
    """The engine's view of a tokenizer: ids in, ids out, nothing else.

    Usually a Hugging Face tokenizer. Any other object with ``encode(text) -> ids`` and
    ``decode(ids) -> text`` plugs in too (the seed's ``TokenizerTrait``), with an
    ``eos_token_id`` (attribute or method) if it has one; chat templates and
    response_format need a Hugging Face tokenizer.
    """

    def __init__(self, tokenizer: Any, extra_eos_token_ids: Iterable[int] = ()) -> None:
        self._hf = tokenizer if isinstance(tokenizer, PreTrainedTokenizerBase) else None
        if self._hf is None and not (
            callable(getattr(tokenizer, "encode", None))
            and callable(getattr(tokenizer, "decode", None))
        ):
            raise ConfigError("tokenizer must have encode(text) and decode(token_ids) methods")
        self._tokenizer = tokenizer
        eos_ids: set[int] = set()
        own_eos = _attribute(tokenizer, "eos_token_id")
        if own_eos is not None:
            eos_ids.add(int(own_eos))
        for token_id in extra_eos_token_ids:
            # A model's generation_config may list eos ids the tokenizer does not mark
            # (e.g. <|eot_id|> next to <|end_of_text|>): stopping needs all of them.
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise ConfigError(f"eos token ids must be non-negative integers, got {token_id!r}")
            eos_ids.add(token_id)
        self._eos_token_ids = frozenset(eos_ids)
        hf = self._hf
        self._special_token_ids = _special_token_ids(hf) if hf is not None else frozenset()
        self._byte_token_ids = _byte_fallback_token_ids(hf) if hf is not None else frozenset()

    @property
    def hf_tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The Hugging Face tokenizer; None for a plugged-in one."""
        return self._hf

    @property
    def vocab_size(self) -> int | None:
        if self._hf is not None:
            # len() counts added tokens; the HF attribute `vocab_size` does not.
            return len(self._hf)
        return _attribute(self._tokenizer, "vocab_size")

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids that `decode(..., skip_special_tokens=True)` drops."""
        return self._special_token_ids

    @property
    def byte_token_ids(self) -> frozenset[int]:
        """Ids of sentencepiece byte-fallback tokens `<0x00>`..`<0xFF>`; empty for others."""
        return self._byte_token_ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._hf is None:
            return [int(i) for i in self._tokenizer.encode(text)]
        return list(self._hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._hf is None:
            return self._tokenizer.decode(list(ids))
        # No clean-up of spaces before punctuation: it rewrites text across token
        # boundaries, which a stream that has already sent the space cannot follow.
        return self._hf.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        if not getattr(self._hf, "chat_template", None):  # (None for a plugged-in tokenizer)
            raise ValidationError(
                "this tokenizer has no chat template; send a plain prompt "
                "(/v1/completions) or use a model whose tokenizer defines one"
            )
        try:
            out = self._hf.apply_chat_template(
                messages,
                add_generation_prompt=add_generation_prompt,
                tokenize=True,
                return_dict=True,
            )
        except jinja2.TemplateError as e:
            # Templates reject bad conversations (roles out of order, ...) this way:
            # that is the caller's input, not our bug.
            raise ValidationError(
                f"chat template rejected the messages: {e}", param="messages"
            ) from e
        # transformers 5 returns a BatchEncoding here; older versions a plain list.
        ids = out["input_ids"] if isinstance(out, Mapping) else out
        return [int(i) for i in ids]


class IncrementalDetokenizer:
    """Turns one sequence's growing list of generated ids into text deltas.

    The vLLM/TGI scheme: decode a short window `ids[prefix_offset:]`, compare with the
    decode of `ids[prefix_offset:read_offset]` (text already sent, kept as context) and
    send only the new suffix. The window slides forward after each send, so a step costs
    O(window), not O(sequence). Text is held back while:

    - it ends in U+FFFD: the last token may end inside a multi-byte character that the
      next token completes. After more than `MAX_PARTIAL_CHAR_TOKENS` held tokens, the
      part that can no longer change (invalid bytes) goes out, so the window stays short;
    - the last (non-skipped) token is a sentencepiece byte-fallback token `<0xNN>`: the
      ByteFallback decoder turns a whole run of byte tokens into one U+FFFD *per byte* as
      soon as any byte in the run is invalid, so "中" from `<0xE4><0xB8><0xAD>` becomes
      four U+FFFD if `<0xFF>` follows. Nothing sent can be taken back, so a run goes out
      when a non-byte token closes it, or at `flush()`. Such runs are usually one word;
      while one lasts no decoding is done at all, so each step is O(1).

    Invariant (tested): with an empty prompt, `"".join(deltas) + flush()` equals
    `tokenizer.decode(generated_ids)`, and at every step the text sent so far is a prefix
    of it: no partial character is sent and then completed.

    With a prompt, the first window includes its last `INITIAL_CONTEXT_TOKENS` tokens, so
    the output is `decode(prompt + generated)` minus `decode(prompt)`. For byte-level BPE
    (GPT-2, SmolLM2, Llama-3, Qwen) that is the same as `decode(generated)`. It differs
    where the decoder looks across the boundary, and then we follow the full decode:
    - Metaspace/sentencepiece decoders strip one leading space from the whole text, so
      `decode(["▁Hi"])` is "Hi" while after a prompt the stream sends " Hi", as a reader
      of prompt + output sees it.
    - A prompt that ends inside a character or a byte-fallback run (never the case for
      encoded text or a chat template) may have its last bytes completed by the output.
      Then the window drops the prompt context and decodes the output on its own, i.e.
      what `decode(generated)` shows: the completion of the prompt's half-character
      appears as U+FFFD.
    `flush()` at the end sends whatever is held, e.g. a truncated character as U+FFFD.
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # Skipped special tokens vanish before the decoder runs, so leaving them out of
        # the window changes no decode, and a run of them cannot make the window grow.
        self._skipped_ids = tokenizer.special_token_ids if skip_special_tokens else frozenset()
        self._byte_ids = tokenizer.byte_token_ids
        # Only the prompt's tail is kept: it is the context, never sent.
        self._ids: list[int] = []
        for token_id in reversed(prompt_token_ids):
            if len(self._ids) == INITIAL_CONTEXT_TOKENS:
                break
            if self._keep(token_id):
                self._ids.append(token_id)
        self._ids.reverse()
        self._prefix_offset = 0  # window start: ids[prefix_offset:read_offset] is context
        self._read_offset = len(self._ids)  # ids from here on are not yet sent
        self._prefix_text = self._decode(0, self._read_offset)
        self._open_byte_run = False
        self._chunks: list[str] = []
        self._text: str | None = ""

    @property
    def text(self) -> str:
        """All text sent so far (the concatenation of the deltas)."""
        if self._text is None:
            self._text = "".join(self._chunks)
        return self._text

    def step(self, new_token_ids: list[int]) -> str:
        """Adds newly generated ids; returns the text they complete, possibly ""."""
        kept = [i for i in new_token_ids if self._keep(i)]
        if not kept:
            return ""
        self._ids.extend(kept)
        self._open_byte_run = kept[-1] in self._byte_ids
        if self._open_byte_run:
            return ""
        return self._emit(final=False)

    def flush(self) -> str:
        """Ends the sequence: returns everything held back (invalid bytes as U+FFFD)."""
        self._open_byte_run = False
        if self._read_offset == len(self._ids):
            return ""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        text = self._decode(self._prefix_offset, len(self._ids))
        if not text.startswith(self._prefix_text):
            # The new ids rewrote text we treated as settled: only possible when the
            # prompt ends mid-character (see the class docstring). Decode from here on
            # without that context.
            logger.debug("detokenizer window lost its prefix; restarting it at the output")
            self._prefix_offset = self._read_offset
            self._prefix_text = ""
            text = self._decode(self._prefix_offset, len(self._ids))
        if final or (len(text) > len(self._prefix_text) and not text.endswith(_REPLACEMENT_CHAR)):
            return self._advance(text, len(self._ids))
        if text.endswith(_REPLACEMENT_CHAR):
            return self._emit_settled(text)
        return ""

    def _emit_settled(self, text: str) -> str:
        """Sends held text that no later token can change, if enough tokens are held."""
        # Every id in the window carries at least one byte (skipped ones never enter it).
        split = len(self._ids) - MAX_PARTIAL_CHAR_TOKENS
        if split <= self._read_offset:
            return ""
        # Bytes before `split` cannot belong to the character being completed; the prefix
        # check makes sure `split` does not cut a character the later tokens finished.
        settled = self._decode(self._prefix_offset, split)
        if len(settled) <= len(self._prefix_text) or not text.startswith(settled):
            return ""
        return self._advance(settled, split)

    def _advance(self, text: str, read_offset: int) -> str:
        """Sends text[len(prefix_text):], the decode of ids[read_offset_old:read_offset]."""
        delta = text[len(self._prefix_text) :]
        # The ids just sent become the next window's context.
        self._prefix_text = self._decode(self._read_offset, read_offset)
        self._prefix_offset = self._read_offset
        self._read_offset = read_offset
        if self._prefix_offset >= _COMPACT_AFTER:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        if delta:
            self._chunks.append(delta)
            self._text = None
        return delta

    def _keep(self, token_id: int) -> bool:
        return token_id not in self._skipped_ids

    def _decode(self, start: int, stop: int) -> str:
        return self._tokenizer.decode(
            self._ids[start:stop], skip_special_tokens=self._skip_special_tokens
        )


def _attribute(tokenizer: Any, name: str) -> Any:
    """A plugged-in tokenizer's value: an attribute, or a method as the seed's trait has."""
    value = getattr(tokenizer, name, None)
    return value() if callable(value) else value


def _special_token_ids(hf_tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    candidates = set(hf_tokenizer.all_special_ids)
    added = getattr(hf_tokenizer, "added_tokens_decoder", {})
    candidates.update(i for i, token in added.items() if getattr(token, "special", False))
    # The detokenizer leaves these ids out of its window, so the set must be exactly what
    # decoding skips: an eos that is an ordinary vocab entry, say, is kept and shown.
    return frozenset(
        i
        for i in candidates
        if hf_tokenizer.decode([i], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        == ""
    )


def _byte_fallback_token_ids(hf_tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    # 256 lookups instead of scanning a 150k-entry vocab; a missing token maps to unk.
    names = [f"<0x{b:02X}>" for b in range(256)]
    ids = hf_tokenizer.convert_tokens_to_ids(names)
    unk = hf_tokenizer.unk_token_id
    return frozenset(i for i in ids if i is not None and i != unk)
