"""Small Hugging Face configs whose checkpoints the loader tests write."""

from __future__ import annotations

import transformers


def tiny_llama(tie: bool) -> transformers.PretrainedConfig:
    return transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )


def tiny_qwen2(tie: bool) -> transformers.PretrainedConfig:
    return transformers.Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )
