"""Tiny random-weight Llama, Mistral and Qwen2 checkpoints for exactness tests.

Sizes are chosen to be awkward: head_dim not a power of two, one KV head, a GQA
ratio of 3, odd layer counts. Weights are drawn with a large init range so that
logits are peaked: near-ties would make greedy argmax depend on rounding, and
the comparison with transformers would test noise instead of the engine.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from tests.helpers import BYTE_FALLBACK_VOCAB_SIZE, make_byte_fallback_tokenizer

COMMON = dict(
    vocab_size=BYTE_FALLBACK_VOCAB_SIZE,
    max_position_embeddings=1024,
    initializer_range=0.5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)

TINY_MODELS = {
    # head_dim 24, one KV head (GQA ratio 3), 3 layers, Llama-3 rope scaling
    "llama": lambda: transformers.LlamaConfig(
        hidden_size=72,
        intermediate_size=112,
        num_hidden_layers=3,
        num_attention_heads=3,
        num_key_value_heads=1,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
        **{**COMMON, "tie_word_embeddings": True},
    ),
    # head_dim 20, GQA ratio 3, 5 layers
    "mistral": lambda: transformers.MistralConfig(
        hidden_size=120,
        intermediate_size=160,
        num_hidden_layers=5,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=20,
        sliding_window=None,
        **COMMON,
    ),
    # q/k/v biases, head_dim 12, no GQA, 3 layers
    "qwen2": lambda: transformers.Qwen2Config(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        **COMMON,
    ),
}


def save_tiny_model(name: str, folder: Path, seed: int = 0, **overrides: object) -> Path:
    """Write a random-weight checkpoint with a tokenizer into ``folder``; ``overrides``
    change the config's fields (e.g. ``tie_word_embeddings=True``)."""
    torch.manual_seed(seed)
    config = TINY_MODELS[name]()
    for key, value in overrides.items():
        setattr(config, key, value)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # random biases too, so a missing bias would show
        for param_name, param in model.named_parameters():
            if param_name.endswith(".bias"):
                param.normal_(0, 0.5)
    model.save_pretrained(folder)
    make_byte_fallback_tokenizer().save_pretrained(folder)
    return folder


def save_perturbed_copy(folder: Path, out: Path, scale: float, seed: int = 1) -> Path:
    """A copy of the checkpoint in ``folder`` with every weight moved by Gaussian noise
    of ``scale`` times its own spread: a model that agrees with the original often but
    not always (a speculative decoding draft whose drafts are partly accepted)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * scale * param.std())
    model.save_pretrained(out)
    make_byte_fallback_tokenizer().save_pretrained(out)
    return out
