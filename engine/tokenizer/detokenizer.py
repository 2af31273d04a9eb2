"""IncrementalDetokenizer: one sequence's generated ids into streamed text deltas."""

from __future__ import annotations

import logging

from hetero_infer.engine.tokenizer.added_tokens_as_written import AddedTokensAsWritten
from hetero_infer.engine.tokenizer.byte_level_detokenizer import ByteLevelDetokenizer
from hetero_infer.engine.tokenizer.sent_text import SentText
from hetero_infer.engine.tokenizer.tokenizer import Tokenizer

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


class IncrementalDetokenizer(SentText):
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
        super().__init__()
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

    def step(self, new_token_ids: list[int]) -> str:
        """Adds newly generated ids; returns the text they complete, possibly ""."""
        kept = [i for i in new_token_ids if i not in self._skipped_ids]  # self._keep, inline
        if not kept:
            return ""
        self._ids.extend(kept)
        if kept[-1] in self._byte_ids:  # a run of bytes may go on: it is held
            return ""
        return self._emit(final=False)

    def flush(self) -> str:
        """Ends the sequence: returns everything held back (invalid bytes as U+FFFD)."""
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
        return self._send(delta)

    def _keep(self, token_id: int) -> bool:
        return token_id not in self._skipped_ids

    def _decode(self, start: int, stop: int) -> str:
        return self._tokenizer.decode(
            self._ids[start:stop], skip_special_tokens=self._skip_special_tokens
        )


Detokenizer = IncrementalDetokenizer | ByteLevelDetokenizer | AddedTokensAsWritten


def new_detokenizer(
    tokenizer: Tokenizer,
    prompt_token_ids: list[int],
    skip_special_tokens: bool = True,
    spaces_between_special_tokens: bool = True,
) -> Detokenizer:
    """A sequence's detokenizer: by bytes where the tokenizer's decoder is byte-level
    BPE's (no decoding a step), else by decoding a window. Without spaces between
    special tokens (vLLM's flag, which only text that keeps them reads), two added
    tokens in a row are written as they are (AddedTokensAsWritten)."""
    bytes_of = tokenizer.byte_level_token_bytes
    detokenizer: Detokenizer
    if bytes_of is not None:
        detokenizer = ByteLevelDetokenizer(
            bytes_of, tokenizer.special_token_ids, skip_special_tokens
        )
    else:
        detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)
    if skip_special_tokens or spaces_between_special_tokens or not tokenizer.added_tokens:
        return detokenizer
    return AddedTokensAsWritten(detokenizer, tokenizer.added_tokens)
