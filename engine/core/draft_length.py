"""How many tokens to draft for one sequence, from how its recent drafts fared.

Every draft token costs a query token in the step that verifies it. On text the
proposer guesses well that is cheap; on text it guesses badly (random or freely
written text, where n-grams match by chance) it is pure cost. So each sequence keeps
its own draft length: a fully accepted draft doubles it (up to the configured
``num_speculative_tokens``); a partly accepted one sets it to what was accepted plus
one; a draft with nothing accepted halves it, and at zero the sequence drafts nothing
for a pause that doubles with each further miss (up to ``MAX_PAUSE`` steps), then
tries a single token again. A miss-prone sequence so drafts about one token every
``MAX_PAUSE`` steps, while one that copies is back at full length within a few steps.
"""

from __future__ import annotations

MAX_PAUSE = 64


class DraftLength:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.current = max_tokens
        self.pause = 0  # decode steps left without drafting
        self.next_pause = 1

    def next(self) -> int:
        """The draft length for this decode step (0: none); counts down a pause."""
        if self.pause:
            self.pause -= 1
            return 0
        return self.current

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """Learn from a verified draft."""
        if num_accepted == num_drafted:
            self.current = min(self.max_tokens, 2 * num_drafted)
            self.next_pause = 1
        elif num_accepted > 0:
            self.current = num_accepted + 1
            self.next_pause = 1
        else:
            self.current = num_drafted // 2
            if self.current == 0:
                self.pause = self.next_pause
                self.next_pause = min(2 * self.next_pause, MAX_PAUSE)
                self.current = 1
