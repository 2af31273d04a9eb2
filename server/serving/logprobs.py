"""Engine logprobs ({token_id: logprob} per token) in OpenAI's two response shapes.

Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, parallel
lists, the top ones keyed by token text. Chat: {"content": [{"token", "logprob",
"bytes", "top_logprobs": [...]}]}. A token's text is its own decode (special tokens
shown); a byte-fallback token that is not a whole character shows as OpenAI
writes such pieces, "bytes:\\xe2", and "bytes" carries the real byte.
"""

from __future__ import annotations

from typing import Any

from hetero_infer.engine.tokenizer import Tokenizer

Entry = dict[int, float]
# JSON has no -Infinity: a masked-out alternative shows this instead, as in vLLM. Nor
# NaN, which logits that overflowed give (a repetition penalty near 0): the same.
MIN_LOGPROB = -9999.0


def _finite(logprob: float) -> float:
    if logprob != logprob:  # NaN
        return MIN_LOGPROB
    return max(logprob, MIN_LOGPROB)


class LogprobsFormatter:
    def __init__(self, tokenizer: Tokenizer, as_token_ids: bool = False) -> None:
        """``as_token_ids``: tokens shown as "token_id:<id>" (vLLM's
        return_tokens_as_token_ids), which any token, a piece of a character too, is."""
        self._tokenizer = tokenizer
        self._as_token_ids = as_token_ids
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def shown(self, token_id: int) -> tuple[str, list[int]]:
        """How the token appears in logprobs: its text and bytes, or its id."""
        if self._as_token_ids:
            text = f"token_id:{token_id}"
            return text, list(text.encode())
        return self.token(token_id)

    def token(self, token_id: int) -> tuple[str, list[int]]:
        """The token's text and its bytes."""
        cached = self._cache.get(token_id)
        if cached is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            raw = list(text.encode("utf-8"))
            if token_id in self._tokenizer.byte_token_ids:
                name = self._tokenizer.hf_tokenizer.convert_ids_to_tokens(token_id)
                raw = [int(name[3:5], 16)]  # "<0xE2>"
                if raw[0] >= 0x80:  # not a character alone
                    text = f"bytes:\\x{raw[0]:02x}"
            cached = self._cache[token_id] = (text, raw)
        return cached

    def width(self, token_id: int) -> int:
        """The token's length in the response text: a multi-byte character made of byte
        tokens counts once, at its lead byte."""
        text, raw = self.token(token_id)
        if text.startswith("bytes:"):
            return 0 if 0x80 <= raw[0] < 0xC0 else 1
        return len(text)

    def text_length(self, token_ids: list[int]) -> int:
        """Where text_offset stands after these tokens."""
        return sum(self.width(t) for t in token_ids)

    def completion(
        self,
        token_ids: list[int],
        entries: list[Entry | None],
        text_offset: int,
    ) -> dict[str, Any]:
        """Completions' logprobs for these tokens; offsets count on from ``text_offset``."""
        body: dict[str, Any] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for token_id, entry in zip(token_ids, entries, strict=True):
            body["tokens"].append(self.shown(token_id)[0])
            body["text_offset"].append(text_offset)
            text_offset += self.width(token_id)
            if entry is None:  # the prompt's first token: nothing predicts it
                body["token_logprobs"].append(None)
                body["top_logprobs"].append(None)
                continue
            body["token_logprobs"].append(_finite(entry[token_id]))
            body["top_logprobs"].append({self.shown(t)[0]: _finite(lp) for t, lp in entry.items()})
        return body

    def chat(self, token_ids: list[int], entries: list[Entry], top: int) -> dict[str, Any]:
        """Chat's logprobs: each token with its ``top`` most likely alternatives."""
        content = []
        for token_id, entry in zip(token_ids, entries, strict=True):
            text, raw = self.shown(token_id)
            best = sorted(entry.items(), key=lambda item: -item[1])[:top]
            content.append(
                {
                    "token": text,
                    "logprob": _finite(entry[token_id]),
                    "bytes": raw,
                    "top_logprobs": [self._chat_item(t, lp) for t, lp in best],
                }
            )
        return {"content": content}

    def prompt(self, entries: list[Entry | None]) -> list[dict[str, Any] | None]:
        """vLLM's prompt_logprobs: per prompt token (None for the first, which nothing
        predicts), its own and its alternatives' {logprob, rank, decoded_token}, keyed
        by token id; the token's rank is the engine's (RankedLogprobs), the others'
        their place among these."""
        body: list[dict[str, Any] | None] = []
        for entry in entries:
            if entry is None:
                body.append(None)
                continue
            places = {
                token_id: place
                for place, token_id in enumerate(sorted(entry, key=lambda t: -entry[t]), 1)
            }
            own = next(iter(entry))  # the prompt token comes first, as in vLLM's
            places[own] = getattr(entry, "rank", places[own])
            body.append(
                {
                    str(token_id): {
                        "logprob": _finite(logprob),
                        "rank": places[token_id],
                        "decoded_token": self._decoded(token_id),
                    }
                    for token_id, logprob in entry.items()
                }
            )
        return body

    def _decoded(self, token_id: int) -> str:
        """The token as vLLM's prompt_logprobs show it: its decode (a piece of a
        character as U+FFFD), or its id."""
        if self._as_token_ids:
            return self.shown(token_id)[0]
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def _chat_item(self, token_id: int, logprob: float) -> dict[str, Any]:
        text, raw = self.shown(token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": raw}
