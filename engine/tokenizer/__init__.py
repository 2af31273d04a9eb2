"""Text in and out of the engine: the Tokenizer wrapper (tokenizer.py) and the
incremental detokenizer that streams generated ids as text (detokenizer.py)."""

from hetero_infer.engine.tokenizer.detokenizer import (
    INITIAL_CONTEXT_TOKENS,
    MAX_PARTIAL_CHAR_TOKENS,
    IncrementalDetokenizer,
)
from hetero_infer.engine.tokenizer.tokenizer import Tokenizer

__all__ = [
    "INITIAL_CONTEXT_TOKENS",
    "MAX_PARTIAL_CHAR_TOKENS",
    "IncrementalDetokenizer",
    "Tokenizer",
]
