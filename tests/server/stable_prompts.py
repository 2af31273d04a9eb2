"""Prompts whose greedy answers on the seed-0 tiny Llama hold in any batch.

For each, the first 48 greedy tokens have no near-tie (top-2 logit gap > 0.01): batches
of other sizes round differently, and a near-tie could flip a token, so only these
prompts can be held to the exact text the engine gives alone.
"""

from __future__ import annotations

STABLE_MAX_TOKENS = 48
_NUMBERS = [3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 16, 17, 18, 19, 20, 21]
STABLE_PROMPTS = [f"Hello world number {i} and the" for i in _NUMBERS]
