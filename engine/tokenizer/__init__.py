"""Text in and out of the engine: the Tokenizer wrapper (tokenizer.py) and the
incremental detokenizers that stream generated ids as text (detokenizer.py; by bytes
for byte-level BPE, byte_level_detokenizer.py)."""

from hetero_infer.engine.tokenizer.detokenizer import (
    INITIAL_CONTEXT_TOKENS,
    MAX_PARTIAL_CHAR_TOKENS,
    Detokenizer,
    IncrementalDetokenizer,
    new_detokenizer,
)
from hetero_infer.engine.tokenizer.tokenizer import Tokenizer

__all__ = [
    "INITIAL_CONTEXT_TOKENS",
    "MAX_PARTIAL_CHAR_TOKENS",
    "Detokenizer",
    "IncrementalDetokenizer",
    "Tokenizer",
    "new_detokenizer",
]
