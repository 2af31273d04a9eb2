"""Stop strings over incrementally decoded text, with the streaming hold-back.

A stop string can be split across tokens, and so across stream chunks. The
text a request has decoded is searched again from a little before the new part
(so a match straddling the old and new text is found), and the tail that could
still become the start of a stop string is held back from the stream until the
next tokens settle it: the stop string never leaks out, and nothing that is not
a stop string is held for longer than it has to be.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    def __init__(self, stop: list[str], include_in_output: bool) -> None:
        assert all(stop), "empty stop strings are dropped by SamplingParams"
        self.stop = stop
        self.include_in_output = include_in_output
        self._longest = max((len(s) for s in stop), default=0)

    def find(self, text: str, new_from: int) -> tuple[int, str] | None:
        """The stop string that completes first in text[new_from:]: (where output ends, it).

        "First" is by end position: generating char by char, that one would have
        stopped the request; of two ending together the longer wins. The output ends
        before it, or after it when included.
        """
        start = max(0, new_from - self._longest + 1)
        best: tuple[int, str] | None = None
        for s in self.stop:
            at = text.find(s, start)
            if at != -1 and (best is None or (at + len(s), at) < (best[0] + len(best[1]), best[0])):
                best = (at, s)
        if best is None:
            return None
        at, s = best
        return (at + len(s) if self.include_in_output else at), s

    def held_back(self, text: str) -> int:
        """How many trailing chars of ``text`` may be the start of a stop string."""
        return partial_match_length(text, self.stop)


def partial_match_length(text: str, strings: Sequence[str]) -> int:
    """How many trailing chars of ``text`` are the start (not the whole) of one of
    ``strings``: the part a stream holds back until the next text settles it."""
    longest = max((len(s) for s in strings), default=0)
    for n in range(min(longest - 1, len(text)), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in strings):
            return n
    return 0
