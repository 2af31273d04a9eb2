"""AddedTokensAsWritten: vLLM's ``spaces_between_special_tokens=False`` over a detokenizer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from hetero_infer.engine.tokenizer.sent_text import SentText


class Streamed(Protocol):
    """What is wrapped: either detokenizer (detokenizer.py, which makes this one)."""

    def step(self, new_token_ids: list[int]) -> str: ...

    def flush(self) -> str: ...


class AddedTokensAsWritten(SentText):
    """A detokenizer's deltas, except that an added token (a special one or another the
    tokenizer added to its vocabulary) right after another is sent as its text alone,
    without the space some decoders put between two tokens (WordPiece's "[CLS] [SEP]"
    becomes "[CLS][SEP]"), as vLLM streams it. The wrapped detokenizer still takes every
    id, so the tokens after it decode in their context."""

    def __init__(self, inner: Streamed, added: Mapping[int, str]) -> None:
        super().__init__()
        self._inner = inner
        self._added = added
        self._last_added = False

    def step(self, new_token_ids: list[int]) -> str:
        """Adds newly generated ids; returns the text they complete, possibly ""."""
        text, run = "", []
        for token_id in new_token_ids:
            written = self._added.get(token_id)
            if written is not None and self._last_added:
                # What was held is out: the token before this one is whole text.
                text += self._inner.step(run)
                self._inner.step([token_id])  # its decoded text is replaced
                text += written
                run = []
            else:
                run.append(token_id)
            self._last_added = written is not None
        return self._send(text + self._inner.step(run))

    def flush(self) -> str:
        """Ends the sequence: returns what the wrapped detokenizer held back."""
        return self._send(self._inner.flush())
