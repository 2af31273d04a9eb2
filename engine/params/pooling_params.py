"""PoolingParams: how an embedding request's final hidden states become its vector, as
vLLM's PoolingParams say it: which positions are pooled ("last": the prompt's last token,
which has attended to the whole prompt; "mean": every position's average), and whether
the vector is scaled to unit L2 length (vLLM's default for embeddings: a dot product of
two is then their cosine similarity; Ollama's legacy /api/embeddings leaves it as it is).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolingParams:
    kind: str = "last"  # EngineConfig.pooling's choices
    normalize: bool = True
