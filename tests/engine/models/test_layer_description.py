"""Every field of ModelConfig that shapes a decoder layer reaches the kernels' one
description of the layers (DecoderStackSpec, which the C++ stack reads field by field),
and what the C++ stack does not compute is refused by name: a field added to the config
and computed by the Python layers can not be silently left out of the C++ stack.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.kernels import decoder_stack_cpu
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.decoder_stack import DecoderLayerSpec, DecoderStackSpec
from hetero_infer.kernels.rotary import rope_tables

from tests.tiny_models import save_tiny_model


def engine_config(folder: Path, dtype: str) -> EngineConfig:
    return EngineConfig(model=str(folder), dtype=dtype, max_num_blocks=16, max_model_len=128)


def same_rope(config: ModelConfig, spec: DecoderStackSpec) -> bool:
    """Each layer's tables are those of its base (a sliding layer's own where there is
    one), its scaling, its rotary part of the head and the context it covers."""

    def tables(theta: float, scaling: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(
            config.head_dim, theta, scaling, config.max_position_embeddings, config.rotary_dim
        )

    full = tables(config.rope_theta, config.rope_scaling)
    sliding = full if config.sliding_rope_theta is None else tables(config.sliding_rope_theta, None)
    expected = [full if w is None else sliding for w in config.sliding_windows]
    return all(
        all(torch.equal(a, b) for a, b in zip(layer.rope, own, strict=True))
        for layer, own in zip(spec.layers, expected, strict=True)
    )


# How each field of a decoder layer reaches the description, checked on each family.
IN_THE_DESCRIPTION = {
    "num_heads": lambda c, s: s.num_heads == c.num_heads,
    "num_kv_heads": lambda c, s: s.num_kv_heads == c.num_kv_heads,
    "head_dim": lambda c, s: s.head_dim == c.head_dim,
    "rms_norm_eps": lambda c, s: s.rms_norm_eps == c.rms_norm_eps,
    "attention_scale": lambda c, s: s.scale == c.softmax_scale,
    "attn_logit_softcap": lambda c, s: s.attn_logit_softcap == c.attn_logit_softcap,
    "sliding_windows": lambda c, s: (
        tuple(la.sliding_window for la in s.layers) == c.sliding_windows
    ),
    "hidden_act": lambda c, s: all(la.activation == c.hidden_act for la in s.layers),
    "qk_norm": lambda c, s: all(({"q", "k"} <= la.norms.keys()) == c.qk_norm for la in s.layers),
    "qk_norm_across_heads": lambda c, s: all(
        la.qk_norm_across_heads == c.qk_norm_across_heads for la in s.layers
    ),
    "sandwich_norms": lambda c, s: all(
        ({"attn_output", "mlp_output"} <= la.norms.keys()) == c.sandwich_norms for la in s.layers
    ),
    "moe": lambda c, s: any(la.gate_up is None for la in s.layers) == (c.moe is not None),
    "rope_theta": same_rope,
    "rope_scaling": same_rope,
    "rotary_dim": same_rope,
    "sliding_rope_theta": same_rope,
    "max_position_embeddings": same_rope,
}
# The layer's fields in its weights, which the projections and norms of the description
# are: their shapes, biases, offsets and kernels' formats.
IN_THE_WEIGHTS = {
    "hidden_size",
    "intermediate_size",
    "qkv_bias",
    "o_bias",
    "mlp_bias",
    "norm_weight_offset",  # added to the norms' weights at load
    "quantized_activation_bits",  # the kept-quantized projections' own
}
# Not the layers': the model's around them, or what the stack never sees.
OUTSIDE_THE_LAYERS = {
    "architecture",
    "model_type",
    "vocab_size",
    "num_layers",  # one description per layer
    "tie_word_embeddings",
    "eos_token_ids",
    "embedding_multiplier",  # the embedding, before the layers
    "final_logit_softcap",  # the logits, after them
    "vision",  # the vision tower, before the embedding
    # M-RoPE's steps with image tokens run layer by layer; the others on one row of
    # positions, which the stack takes (engine/worker/mrope_positions.py)
    "mrope_section",
}


def test_every_config_field_is_placed():
    fields = {field.name for field in dataclasses.fields(ModelConfig)}
    placed = IN_THE_DESCRIPTION.keys() | IN_THE_WEIGHTS | OUTSIDE_THE_LAYERS
    assert fields == placed, (fields - placed, placed - fields)


# Between them every optional part: q/k norms (each head, across heads), sandwich
# norms, tanh-GELU, soft-capping, a query scale, sliding windows with a base of their own,
# partial rotary with LongRoPE, experts.
@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2", "gemma3", "phi3", "olmoe"])
def test_each_layer_field_reaches_the_description(name, tmp_path):
    folder = save_tiny_model(name, tmp_path / name)
    engine = LLMEngine(engine_config(folder, "float32"))
    model = engine.runner.model
    spec = model.decoder_stack_spec()
    unreflected = [f for f, holds in IN_THE_DESCRIPTION.items() if not holds(model.config, spec)]
    assert unreflected == []


@pytest.mark.cpu_kernels("linear_packed")
def test_a_part_the_description_gains_is_refused_by_name(tmp_path):
    """A field or a norm the C++ stack does not know is named, not ignored: the steps
    run layer by layer."""
    module = load_cpu_kernels()

    @dataclasses.dataclass(frozen=True)
    class WithANewPart(DecoderLayerSpec):
        new_part: bool = True

    folder = save_tiny_model("qwen3", tmp_path / "qwen3")
    engine = LLMEngine(engine_config(folder, "bfloat16"))
    spec = engine.runner.model.decoder_stack_spec()
    assert decoder_stack_cpu.unserved_parts(module, spec) == []
    first = spec.layers[0]
    gained = WithANewPart(**{f.name: getattr(first, f.name) for f in dataclasses.fields(first)})
    other_norm = dataclasses.replace(
        first, norms={**first.norms, "per_layer_input": first.norms["q"]}
    )
    for layer, part in ((gained, "the layer's new_part"), (other_norm, "the per_layer_input norm")):
        changed = dataclasses.replace(spec, layers=(layer, *spec.layers[1:]))
        assert decoder_stack_cpu.unserved_parts(module, changed) == [part]
        assert decoder_stack_cpu.pack_decoder_stack(module, changed) is None
    # one layer's projection not one of our kernels' (a torch module): none is named,
    # and the steps go layer by layer too
    assert decoder_stack_cpu.pack_decoder_stack(module, spec) is not None
    foreign = dataclasses.replace(spec.layers[1], o=torch.nn.Identity())
    changed = dataclasses.replace(spec, layers=(first, foreign, *spec.layers[2:]))
    assert decoder_stack_cpu.pack_decoder_stack(module, changed) is None


@pytest.mark.cpu_kernels("linear_packed")
def test_a_layer_missing_a_part_it_needs_is_refused(tmp_path):
    """A description without a field, a layer without its qkv projection, its
    post-attention norm or a dense MLP's down projection, norms across heads for only
    one of q and k: the C++ stack refuses to take the layer rather than dereference the
    part it lacks at the next step (a layer without gate_up is a sparse one, refused by
    name without its expert block)."""
    module = load_cpu_kernels()
    folder = save_tiny_model("qwen3", tmp_path / "qwen3")
    spec = LLMEngine(engine_config(folder, "bfloat16")).runner.model.decoder_stack_spec()
    first = spec.layers[0]
    assert "q" in first.norms and "k" in first.norms and first.down is not None
    description = decoder_stack_cpu.layer_description(module, first)
    del description["sliding_window"]
    with pytest.raises(RuntimeError, match="a decoder layer's description without sliding_win"):
        module.decoder_layer_unserved(description)

    def without(name: str) -> dict[str, torch.Tensor]:
        return {place: norm for place, norm in first.norms.items() if place != name}

    for layer, message in (
        (dataclasses.replace(first, qkv=None), "a decoder layer without its qkv projection"),
        (dataclasses.replace(first, norms=without("post_attention")), "without its two RMSNorms"),
        (dataclasses.replace(first, down=None), "either a dense MLP"),
        (
            dataclasses.replace(first, norms=without("k"), qk_norm_across_heads=True),
            "q and k norms across heads without the norms",
        ),
    ):
        changed = dataclasses.replace(spec, layers=(layer, *spec.layers[1:]))
        with pytest.raises(RuntimeError, match=message):
            decoder_stack_cpu.pack_decoder_stack(module, changed)
