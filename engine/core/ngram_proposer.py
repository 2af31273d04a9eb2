"""N-gram (prompt lookup) proposals: continue the text the way it went before.

Answers that summarise, quote or edit their input copy spans of it. Where the last n
tokens also occurred earlier (in the prompt or the output), the tokens that followed
their most recent earlier occurrence are a good guess for what comes next. n runs
from ``max_n`` down to ``min_n``: a longer match is better evidence.

The search runs in C, not in a Python loop over tokens: the token history is kept as
a ``str`` of one character per token id (``chr(id)``; every vocabulary fits below
0x110000), grown as tokens are appended, and ``str.rfind`` finds the match.
"""

from __future__ import annotations


class TokenText:
    """A sequence's token ids as a string of one character each, kept up to date."""

    def __init__(self) -> None:
        self.text = ""

    def sync(self, token_ids: list[int]) -> str:
        """The string of ``token_ids``, which only ever grow at the end."""
        if len(self.text) < len(token_ids):
            self.text += "".join(map(chr, token_ids[len(self.text) :]))
        return self.text


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        assert 1 <= min_n <= max_n
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, text: str, num_tokens: int) -> list[int]:
        """Up to ``num_tokens`` tokens that followed the most recent earlier occurrence
        of the longest suffix of ``text`` (``max_n`` down to ``min_n`` tokens) that has
        one; [] when none has."""
        length = len(text)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            # An occurrence inside text[: length - 1] ends before the last token, so at
            # least one token follows it (it may overlap the suffix itself: a repeating
            # pattern continues).
            at = text.rfind(text[length - n :], 0, length - 1)
            if at >= 0:
                follows = [ord(c) for c in text[at + n : at + n + num_tokens]]
                # Where the continuation runs into the present, it goes on copying at the
                # same distance, from the proposal itself: a repeating pattern repeats.
                period = length - n - at
                while len(follows) < num_tokens:
                    follows.append(follows[len(follows) - period])
                return follows
        return []
