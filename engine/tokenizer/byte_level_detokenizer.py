"""ByteLevelDetokenizer: a byte-level BPE tokenizer's generated ids (GPT-2's scheme, as
in SmolLM2, Llama 3 and Qwen) streamed as text, a token's bytes at a time.

Such a decoder turns each token's characters back into the bytes they stand for and
decodes the bytes of all the ids together as UTF-8, each maximal invalid run becoming
one U+FFFD (Rust's ``from_utf8_lossy``, as Python's "replace" does). So the text of
the ids is the decode of their bytes joined, and a stream needs no decoding window:
Python's incremental UTF-8 decoder keeps the bytes of a character still being
completed and gives everything before them, which no later byte can change (UTF-8
starts again at each character). Where the window detokenizer (detokenizer.py) runs
the Rust decoder twice a token, this one looks a token's bytes up once.

The prompt takes no part: after a prompt that ends between characters (always, for
encoded text), decode(prompt + output) minus decode(prompt) is decode(output); after
one that ends inside a character, the window detokenizer decodes the output alone too.
"""

from __future__ import annotations

import codecs
from typing import Any

from hetero_infer.engine.tokenizer.sent_text import SentText


def _byte_of_character() -> dict[str, int]:
    """GPT-2's table, reversed: the character that stands for each byte. Printable
    bytes stand for themselves; the others, in order, for the characters from 256 on."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = (b for b in range(256) if b not in printable)
    table = {chr(b): b for b in printable}
    table.update((chr(256 + i), b) for i, b in enumerate(shifted))
    return table


_BYTE_OF_CHARACTER = _byte_of_character()


def token_bytes(token: str) -> bytes:
    """The bytes a byte-level decoder makes of one token: its characters' bytes, or the
    token's own UTF-8 where a character is not in the table (an added token's text)."""
    try:
        return bytes(_BYTE_OF_CHARACTER[c] for c in token)
    except KeyError:
        return token.encode()


class TokenBytes:
    """Each id's bytes under a byte-level decoder, found once (``backend``: a fast
    tokenizer's Rust tokenizer)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._bytes: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        found = self._bytes.get(token_id)
        if found is None:
            token = self._backend.id_to_token(token_id)
            # An id without a token decodes to nothing, as the Rust decoder skips it.
            found = self._bytes[token_id] = b"" if token is None else token_bytes(token)
        return found


class ByteLevelDetokenizer(SentText):
    """Turns one sequence's generated ids into text deltas (IncrementalDetokenizer's
    contract: the deltas and ``flush()`` add up to the decode of the ids, and the text
    sent is always a prefix of it)."""

    def __init__(
        self,
        bytes_of: TokenBytes,
        special_token_ids: frozenset[int],
        skip_special_tokens: bool = True,
    ) -> None:
        super().__init__()
        self._bytes_of = bytes_of
        self._skipped_ids = special_token_ids if skip_special_tokens else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def step(self, new_token_ids: list[int]) -> str:
        """Adds newly generated ids; returns the text they complete, possibly ""."""
        data = b"".join(self._bytes_of(i) for i in new_token_ids if i not in self._skipped_ids)
        return self._send(self._utf8.decode(data))

    def flush(self) -> str:
        """Ends the sequence: returns what was held (an unfinished character as U+FFFD)."""
        return self._send(self._utf8.decode(b"", final=True))
