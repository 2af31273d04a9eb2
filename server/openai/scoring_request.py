"""The bodies of vLLM's /v1/score (text_1 against text_2) and of /rerank and /v1/rerank
(Jina's and Cohere's shape: a query against documents)."""

from __future__ import annotations

from hetero_infer.server.openai.unsupported_fields import SCORE
from hetero_infer.server.serving.request_body import RequestBody, check_text
from pydantic import Field, field_validator

# As many texts as one embeddings request takes.
MAX_SCORED_TEXTS = 2048


class ScoreRequest(RequestBody):
    """text_1 and text_2: one text against several (either way round), or two lists
    of the same length scored pair by pair."""

    UNSUPPORTED = SCORE

    model: str | None = None
    text_1: str | list[str] = Field(min_length=1)
    text_2: str | list[str] = Field(min_length=1)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    user: str | None = None
    # vLLM's: lower first, with --scheduling-policy priority.
    priority: int = 0

    @field_validator("text_1", "text_2")
    @classmethod
    def _valid_texts(cls, value: str | list[str]) -> str | list[str]:
        texts = [value] if isinstance(value, str) else value
        if len(texts) > MAX_SCORED_TEXTS:
            raise ValueError(f"at most {MAX_SCORED_TEXTS} texts")
        for text in texts:
            check_text(text)
        return value

    def pairs(self) -> list[tuple[str, str]]:
        """The (text_1, text_2) pairs to score; a 400's message where they do not pair."""
        first = [self.text_1] if isinstance(self.text_1, str) else self.text_1
        second = [self.text_2] if isinstance(self.text_2, str) else self.text_2
        if len(first) == 1:
            first = first * len(second)
        elif len(second) == 1:
            second = second * len(first)
        if len(first) != len(second):
            raise ValueError(
                f"text_1 and text_2 must be one text and a list, or lists of one length "
                f"(got {len(first)} and {len(second)})"
            )
        return list(zip(first, second, strict=True))


class RerankDocument(RequestBody):
    text: str


class RerankRequest(RequestBody):
    """A query against documents (strings, or Cohere's ``{"text": ...}``); the best
    ``top_n`` of them (all by default) come back, best first."""

    UNSUPPORTED = SCORE

    model: str | None = None
    query: str = Field(min_length=1)
    documents: list[str | RerankDocument] = Field(min_length=1, max_length=MAX_SCORED_TEXTS)
    top_n: int | None = Field(default=None, ge=0)
    return_documents: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    user: str | None = None
    # vLLM's: lower first, with --scheduling-policy priority.
    priority: int = 0

    @field_validator("query")
    @classmethod
    def _valid_query(cls, value: str) -> str:
        return check_text(value)

    def texts(self) -> list[str]:
        return [check_text(d if isinstance(d, str) else d.text) for d in self.documents]
