"""How a checkpoint splits over tensor-parallel ranks: every rank's shares put back
together are the whole tensor, and the sharded layers' partial products add up to the
full one. No processes: the arithmetic alone."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.engine.models import ModelConfig
from hetero_infer.engine.models.sharding import (
    check_divisible,
    padded_vocab_shard,
    shard_config,
    shard_state_dict,
)
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import ConfigError

from tests.tiny_models import TINY_MODELS


def model_config(name: str) -> ModelConfig:
    return ModelConfig.from_hf(TINY_MODELS[name]())


def test_shard_config_divides_heads_mlp_and_pads_the_vocabulary():
    config = model_config("mistral")  # 6 heads, 2 KV heads, intermediate 160, vocab 384
    local = shard_config(config, 2)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (3, 1, 80)
    assert local.vocab_size == 192 and local.head_dim == config.head_dim
    assert padded_vocab_shard(385, 2) == 193 and padded_vocab_shard(384, 3) == 128


@pytest.mark.parametrize(
    ("name", "size", "named"),
    [
        ("llama", 2, "attention heads (3), KV heads (1)"),  # 3 heads, 1 KV head
        ("mistral", 4, "attention heads (6), KV heads (2)"),
        ("qwen2", 3, "attention heads (4), KV heads (4), intermediate size (80)"),
    ],
)
def test_uneven_split_is_refused_naming_the_numbers(name, size, named):
    with pytest.raises(ConfigError) as refused:
        check_divisible(model_config(name), size)
    message = str(refused.value)
    assert message.startswith(f"tensor_parallel_size {size} must divide"), message
    assert message.endswith(f"it does not divide its {named}"), message


def test_even_splits_pass():
    check_divisible(model_config("mistral"), 2)
    check_divisible(model_config("qwen2"), 4)


def fake_state_dict(vocab: int = 7) -> dict[str, torch.Tensor]:
    """Distinct values everywhere, so any misplaced row or column shows."""
    shapes = {
        "model.embed_tokens.weight": (vocab, 4),
        "lm_head.weight": (vocab, 4),
        "model.norm.weight": (4,),
        "model.layers.0.self_attn.q_proj.weight": (8, 4),
        "model.layers.0.self_attn.q_proj.bias": (8,),
        "model.layers.0.self_attn.k_proj.weight": (4, 4),
        "model.layers.0.self_attn.v_proj.weight": (4, 4),
        "model.layers.0.self_attn.o_proj.weight": (4, 8),
        "model.layers.0.self_attn.o_proj.bias": (4,),
        "model.layers.0.mlp.gate_proj.weight": (6, 4),
        "model.layers.0.mlp.up_proj.weight": (6, 4),
        "model.layers.0.mlp.down_proj.weight": (4, 6),
        "model.layers.0.mlp.down_proj.bias": (4,),
        "model.layers.0.input_layernorm.weight": (4,),
    }
    torch.manual_seed(0)
    return {name: torch.randn(shape) for name, shape in shapes.items()}


def test_shards_put_back_together_are_the_checkpoint():
    full = fake_state_dict(vocab=7)  # 7 rows over 2 ranks: 4 each, one padding row
    shards = [shard_state_dict(full, rank, 2) for rank in range(2)]
    for name, tensor in full.items():
        parts = [s[name] for s in shards]
        if any(p in name for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
            assert torch.equal(torch.cat(parts, dim=0), tensor), name
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            assert torch.equal(torch.cat(parts, dim=1), tensor), name
        elif name.endswith(("o_proj.bias", "down_proj.bias")):
            assert torch.equal(parts[0], tensor) and not parts[1].any(), name  # added once
        elif "embed_tokens" in name or "lm_head" in name:
            assert all(p.shape == (4, 4) for p in parts), name
            joined = torch.cat(parts)
            assert torch.equal(joined[:7], tensor) and not joined[7:].any(), name
        else:  # norms: every rank holds them whole
            assert all(torch.equal(p, tensor) for p in parts), name


def test_row_parallel_partial_products_add_up_to_the_full_one():
    full = fake_state_dict()
    x = torch.randn(3, 6, dtype=torch.float64)
    name = "model.layers.0.mlp.down_proj"
    weight, bias = full[f"{name}.weight"].double(), full[f"{name}.bias"].double()
    expected = torch.nn.functional.linear(x, weight, bias)
    total = torch.zeros_like(expected)
    for rank in range(2):
        shard = shard_state_dict(full, rank, 2)
        columns = x.chunk(2, dim=1)[rank]  # the column-parallel layer before gives these
        w, b = shard[f"{name}.weight"].double(), shard[f"{name}.bias"].double()
        total += torch.nn.functional.linear(columns, w, b)
    torch.testing.assert_close(total, expected)


def test_quantized_blocks_are_refused():
    from hetero_infer.kernels.quantized import QuantizedWeight

    weight = QuantizedWeight("Q8_0", torch.zeros(2, 34, dtype=torch.uint8), (2, 32), None)
    with pytest.raises(ConfigError, match="quantization 'none'"):
        shard_state_dict({"model.layers.0.mlp.down_proj.weight": weight}, 0, 2)


def test_config_refuses_kept_quantized_weights_with_tensor_parallelism():
    for quantization in ("gguf", "int8", "compressed-tensors"):
        with pytest.raises(ConfigError, match="tensor parallelism does not split"):
            EngineConfig(tensor_parallel_size=2, quantization=quantization)
    assert EngineConfig(tensor_parallel_size=2, quantization="auto").tensor_parallel_size == 2
    with pytest.raises(ConfigError, match="tensor_parallel_size must be an integer >= 1"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ConfigError, match="distributed_executor_backend"):
        EngineConfig(distributed_executor_backend="ray")
