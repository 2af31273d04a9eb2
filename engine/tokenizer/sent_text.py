"""SentText: what a detokenizer has sent, the deltas kept and joined only when asked."""

from __future__ import annotations


class SentText:
    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._text: str | None = ""

    @property
    def text(self) -> str:
        """All text sent so far (the concatenation of the deltas)."""
        if self._text is None:
            self._text = "".join(self._chunks)
        return self._text

    def _send(self, delta: str) -> str:
        """Records a delta (a step's text, possibly "") and returns it."""
        if delta:
            self._chunks.append(delta)
            self._text = None
        return delta
