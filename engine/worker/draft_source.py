"""Which draft model to load, checked against the target before any weight is read.

A draft model's tokens are verified by the target as token ids, so both must read ids
the same way: the same vocabulary size (the logits are compared row against row) and,
where the draft comes from elsewhere than the target, the same tokenizer vocabulary
(string -> id). It must also reach the target's max_model_len. Anything else refuses
the start with a message that says what differs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hetero_infer.engine import loader
from hetero_infer.engine.models import ModelConfig
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.engine.settings.speculative_config import NAME, SpeculativeConfig

logger = logging.getLogger(__name__)

# The name in {"model": ...} that means the embedded default model.
DEFAULT_DRAFT_NAME = "default"


@dataclass(frozen=True)
class DraftSource:
    source: loader.ModelSource
    model_config: ModelConfig
    quantization: str


def resolve_draft(
    spec: SpeculativeConfig,
    target_source: loader.ModelSource,
    target_config: ModelConfig,
    max_model_len: int,
    target_tokenizer: Any,
) -> DraftSource:
    """The draft model's source and config; ConfigError where it cannot draft for the
    target."""
    assert spec.model is not None
    name = None if spec.model == DEFAULT_DRAFT_NAME else spec.model
    source = loader.resolve_model(name)
    config = ModelConfig.from_hf(loader.load_config(source))
    if config.vocab_size != target_config.vocab_size:
        raise ConfigError(
            f"{NAME}: the draft model {spec.model!r} has a vocabulary of "
            f"{config.vocab_size} tokens, the target {target_config.vocab_size}; a draft "
            "model must share the target's tokenizer"
        )
    if config.max_position_embeddings < max_model_len:
        raise ConfigError(
            f"{NAME}: the draft model {spec.model!r} reaches {config.max_position_embeddings} "
            f"positions, fewer than max_model_len ({max_model_len})"
        )
    if source != target_source:
        draft_tokenizer = loader.load_tokenizer(source)
        _check_same_tokenizer(spec.model, draft_tokenizer, target_tokenizer, config.vocab_size)
    return DraftSource(source, config, spec.quantization)


def _check_same_tokenizer(name: str, draft: Any, target: Any, vocab_size: int) -> None:
    """Every id either model can produce (below ``vocab_size``) names the same token in
    both tokenizers (tokens added past the embedding, which no model produces, may
    differ)."""
    if not hasattr(target, "get_vocab"):
        # A tokenizer object of the caller's own, with no vocabulary to compare: the
        # vocabulary sizes agreed, which is all that can be checked.
        logger.warning("the target's tokenizer has no get_vocab(): the draft's is not compared")
        return
    mine, theirs = (
        {token: i for token, i in t.get_vocab().items() if i < vocab_size} for t in (draft, target)
    )
    if mine == theirs:
        return
    differ = sorted(
        (token for token in mine.keys() | theirs.keys() if mine.get(token) != theirs.get(token)),
        key=lambda token: (mine.get(token, -1), token),
    )
    examples = ", ".join(
        f"{token!r}: {mine.get(token)} vs {theirs.get(token)}" for token in differ[:3]
    )
    raise ConfigError(
        f"{NAME}: the draft model {name!r} has another tokenizer than the target "
        f"({len(differ)} tokens differ, e.g. {examples}); a draft model must share the "
        "target's tokenizer"
    )
