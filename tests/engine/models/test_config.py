"""engine/models/config.py: ModelConfig reads each Hugging Face config's rules once
(head_dim, biases, RoPE, sliding windows, eos ids), and the registry builds a CausalLM
from it."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
import transformers
from hetero_infer.engine.models import CausalLM, ModelConfig, architecture_of, build_model
from hetero_infer.kernels import select_kernels

from tests.tiny_models import TINY_MODELS


def test_tiny_llama() -> None:
    config = ModelConfig.from_hf(TINY_MODELS["llama"]())
    assert (config.architecture, config.model_type) == ("LlamaForCausalLM", "llama")
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (3, 72, 112)
    # head_dim from hidden_size / heads when the config names none
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (3, 1, 24)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling is not None and config.rope_scaling["rope_type"] == "llama3"
    assert config.sliding_windows == (None, None, None)
    assert config.tie_word_embeddings and config.hidden_act == "silu"
    assert (config.qkv_bias, config.o_bias, config.mlp_bias) == (False, False, False)
    assert config.eos_token_ids == (2,)
    assert (config.vocab_size, config.max_position_embeddings) == (384, 1024)


def test_mistral_head_dim_and_sliding_window() -> None:
    config = ModelConfig.from_hf(TINY_MODELS["mistral"]())
    assert (config.num_heads, config.head_dim, config.hidden_size) == (6, 20, 120)
    assert config.rope_scaling is None and not config.tie_word_embeddings
    sliding = transformers.MistralConfig(num_hidden_layers=2, sliding_window=4096)
    assert ModelConfig.from_hf(sliding).sliding_windows == (4096, 4096)


def test_qwen2_biases_and_windows() -> None:
    config = ModelConfig.from_hf(TINY_MODELS["qwen2"]())
    # Qwen2 has q/k/v biases and no o_proj bias, whatever attention_bias says.
    assert (config.qkv_bias, config.o_bias) == (True, False)
    assert config.sliding_windows == (None, None, None)
    # Only the layers past max_window_layers slide.
    sliding = transformers.Qwen2Config(
        num_hidden_layers=3, sliding_window=64, use_sliding_window=True, max_window_layers=1
    )
    assert ModelConfig.from_hf(sliding).sliding_windows == (None, 64, 64)


def test_qwen3_and_gemma3_layers() -> None:
    qwen3 = ModelConfig.from_hf(TINY_MODELS["qwen3"]())
    assert qwen3.architecture == "Qwen3ForCausalLM" and qwen3.qk_norm
    assert not qwen3.sandwich_norms and qwen3.norm_weight_offset == 0.0
    assert qwen3.head_dim == 24 and qwen3.softmax_scale == 24**-0.5
    assert (qwen3.qkv_bias, qwen3.o_bias) == (False, False)
    assert qwen3.quantized_activation_bits == 8

    gemma = ModelConfig.from_hf(TINY_MODELS["gemma3"]())
    assert (gemma.architecture, gemma.model_type) == ("Gemma3ForCausalLM", "gemma3_text")
    assert gemma.qk_norm and gemma.sandwich_norms and gemma.norm_weight_offset == 1.0
    assert gemma.hidden_act == "gelu_pytorch_tanh"
    assert gemma.embedding_multiplier == 64**0.5
    assert gemma.softmax_scale == 24**-0.5  # query_pre_attn_scalar, not head_dim (16)
    assert gemma.sliding_windows == (8, 8, None, 8)
    # Each layer kind its own RoPE base (transformers 5's rope_parameters by layer type).
    assert (gemma.rope_theta, gemma.sliding_rope_theta) == (1_000_000.0, 10_000.0)
    assert gemma.rope_scaling is None
    # Its activations' outlier channels: the quantized kernel rounds them to 16 bits.
    assert gemma.quantized_activation_bits == 16


def test_gemma2_soft_capping_and_alternating_layers() -> None:
    gemma = ModelConfig.from_hf(TINY_MODELS["gemma2"]())
    assert (gemma.architecture, gemma.model_type) == ("Gemma2ForCausalLM", "gemma2")
    # Gemma 3's layer but for the q/k norms
    assert not gemma.qk_norm and gemma.sandwich_norms and gemma.norm_weight_offset == 1.0
    assert gemma.hidden_act == "gelu_pytorch_tanh" and gemma.embedding_multiplier == 64**0.5
    assert gemma.head_dim == 32 and gemma.softmax_scale == 24**-0.5
    assert (gemma.attn_logit_softcap, gemma.final_logit_softcap) == (10.0, 10.0)
    # transformers 5's layer_types: the even layers slide; one RoPE base for both kinds
    assert gemma.sliding_windows == (8, None, 8, None)
    assert (gemma.rope_theta, gemma.sliding_rope_theta) == (10_000.0, None)
    # A config from before layer_types slides the same layers; Gemma 2's defaults cap
    # at 50 and 30; no other family caps.
    hf = SimpleNamespace(**{**vars(transformers.Gemma2Config()), "model_type": "gemma2"})
    del hf.layer_types
    older = ModelConfig.from_hf(hf)
    assert older.sliding_windows == (4096, None) * 13
    assert (older.attn_logit_softcap, older.final_logit_softcap) == (50.0, 30.0)
    gemma3 = ModelConfig.from_hf(TINY_MODELS["gemma3"]())
    assert (gemma3.attn_logit_softcap, gemma3.final_logit_softcap) == (None, None)


def test_phi3_longrope_and_partial_rotary() -> None:
    config = ModelConfig.from_hf(TINY_MODELS["phi3"]())
    assert config.architecture == "Phi3ForCausalLM"
    scaling = config.rope_scaling
    assert scaling["rope_type"] == "longrope"
    assert scaling["original_max_position_embeddings"] == 512
    # transformers' attention factor for a context extended 1024 / 512 = 2 times
    assert scaling["attention_factor"] == pytest.approx((1 + math.log(2) / math.log(512)) ** 0.5)
    # As Phi-4-mini, RoPE on 3/4 of each head.
    assert (config.head_dim, config.rotary_dim) == (24, 18)
    odd = TINY_MODELS["phi3"]()
    odd.rope_parameters = {**odd.rope_parameters, "partial_rotary_factor": 0.55}  # 13.2 dims
    with pytest.raises(ValueError, match="partial_rotary_factor 0.55 rotates 13 of 24"):
        ModelConfig.from_hf(odd)


def test_gemma3_transformers_4_rope_settings() -> None:
    """4.x keeps the sliding layers' base as rope_local_base_freq, the global layers'
    scaling (Gemma 3 4B: linear, 8) as rope_scaling."""
    hf = SimpleNamespace(
        **{
            **vars(TINY_MODELS["gemma3"]()),
            "model_type": "gemma3_text",  # a class attribute, not in vars()
            "rope_parameters": None,
            "rope_theta": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        }
    )
    config = ModelConfig.from_hf(hf)
    assert (config.rope_theta, config.sliding_rope_theta) == (1_000_000.0, 10_000.0)
    assert config.rope_scaling == {"rope_type": "linear", "factor": 8.0}


def test_attention_bias_puts_biases_on_every_projection() -> None:
    config = ModelConfig.from_hf(
        transformers.LlamaConfig(num_hidden_layers=1, attention_bias=True, mlp_bias=True)
    )
    assert (config.qkv_bias, config.o_bias, config.mlp_bias) == (True, True, True)


def test_transformers_4_config_shape() -> None:
    # transformers 4.x: rope_theta and rope_scaling as attributes, no rope_parameters;
    # a GGUF conversion names no architectures, only the model type.
    scaling = {"rope_type": "linear", "factor": 2.0}
    hf = SimpleNamespace(
        model_type="llama",
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=5000.0,
        rope_scaling=scaling,
        max_position_embeddings=64,
        hidden_act="silu",
        eos_token_id=[3, 4],
    )
    config = ModelConfig.from_hf(hf)
    assert config.architecture == "LlamaForCausalLM"
    assert (config.rope_theta, config.rope_scaling) == (5000.0, scaling)
    assert config.rope_scaling is not scaling  # a copy: the HF config stays its own
    assert config.head_dim == 4 and config.eos_token_ids == (3, 4)
    assert not config.tie_word_embeddings and not config.qkv_bias
    assert (
        ModelConfig.from_hf(SimpleNamespace(**{**vars(hf), "eos_token_id": None})).eos_token_ids
        == ()
    )


def test_unsupported_architecture_is_named() -> None:
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        architecture_of(SimpleNamespace(architectures=["GPT2LMHeadModel"], model_type="gpt2"))
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        architecture_of(SimpleNamespace(architectures=None, model_type="gpt2"))


def test_frozen_and_checked() -> None:
    config = ModelConfig.from_hf(TINY_MODELS["qwen2"]())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_layers = 4  # type: ignore[misc]
    with pytest.raises(ValueError, match="2 layer types for 3 layers"):
        dataclasses.replace(config, sliding_windows=(None, None))


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_registry_builds_a_causal_lm(name: str) -> None:
    config = ModelConfig.from_hf(TINY_MODELS[name]())
    kernels = select_kernels("auto", torch.device("cpu"))
    with torch.device("meta"):
        model = build_model(config, kernels)
    assert isinstance(model, CausalLM)
    assert model.config is config and model.kernels is kernels
    assert (model.num_layers, model.num_kv_heads, model.head_dim) == (
        config.num_layers,
        config.num_kv_heads,
        config.head_dim,
    )
    assert model.sliding_windows == set(config.sliding_windows)
    assert len(model.layers) == config.num_layers
