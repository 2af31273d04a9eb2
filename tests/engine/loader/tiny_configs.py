"""Small Hugging Face configs whose checkpoints the loader tests write."""

from __future__ import annotations

import transformers


def tiny_llama(tie: bool) -> transformers.PretrainedConfig:
    return _tiny(transformers.LlamaConfig, num_hidden_layers=2, tie=tie)


def tiny_qwen2(tie: bool) -> transformers.PretrainedConfig:
    return _tiny(transformers.Qwen2Config, num_hidden_layers=3, tie=tie)


def _tiny(
    config_class: type[transformers.PretrainedConfig], num_hidden_layers: int, tie: bool
) -> transformers.PretrainedConfig:
    return config_class(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )
