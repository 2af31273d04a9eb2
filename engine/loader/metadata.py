"""A model's Hugging Face config and tokenizer, from its folder or its GGUF file."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import transformers
from hetero_infer.engine.loader.gguf_metadata import gguf_metadata_folder
from hetero_infer.engine.loader.source import ModelSource
from hetero_infer.engine.models import architecture_of
from hetero_infer.engine.models.architectures import BY_ARCHITECTURE, family_chat_template
from hetero_infer.engine.settings.exceptions import ConfigError

logger = logging.getLogger(__name__)


def load_config(source: ModelSource) -> transformers.PretrainedConfig:
    """The model's HF config; rejects architectures the decoder does not run."""
    config = transformers.AutoConfig.from_pretrained(_metadata_folder(source))
    try:
        architecture = architecture_of(config)
    except ValueError as exc:
        raise ConfigError(f"model {str(source.path)!r}: {exc}") from exc
    text = config.get_text_config()  # a vision-language model's decoder
    logger.info(
        "config %s from %s: %d layers, hidden %d, %d heads, %d kv heads, vocab %d",
        architecture,
        source.path,
        text.num_hidden_layers,
        text.hidden_size,
        text.num_attention_heads,
        text.num_key_value_heads,
        text.vocab_size,
    )
    return config


def load_tokenizer(source: ModelSource) -> transformers.PreTrainedTokenizerBase:
    """The HF tokenizer that ships with the weights (a GGUF file embeds its own)."""
    start = time.perf_counter()
    tokenizer = transformers.AutoTokenizer.from_pretrained(_metadata_folder(source))
    logger.info(
        "tokenizer %s from %s in %.1f s",
        type(tokenizer).__name__,
        source.path,
        time.perf_counter() - start,
    )
    return tokenizer


def with_family_chat(tokenizer: Any, architecture: str) -> tuple[int, ...]:
    """Give a Hugging Face tokenizer that carries no chat template its family's own
    (Gemma's GGUF files carry none); the ids of the token that ends the family's chat
    turns, where it has one beside eos (none for a plugged-in tokenizer)."""
    if not isinstance(tokenizer, transformers.PreTrainedTokenizerBase):
        return ()
    family = BY_ARCHITECTURE[architecture]
    template = family_chat_template(family)
    if template is not None and not getattr(tokenizer, "chat_template", None):
        logger.info("the tokenizer has no chat template: using %s's", family.chat_template)
        tokenizer.chat_template = template
    if family.end_of_turn is None:
        return ()
    token_id = tokenizer.convert_tokens_to_ids(family.end_of_turn)
    return () if token_id is None or token_id == tokenizer.unk_token_id else (token_id,)


def _metadata_folder(source: ModelSource) -> Path:
    """A folder with the model's config.json and tokenizer files."""
    return gguf_metadata_folder(source) if source.is_gguf else source.folder
