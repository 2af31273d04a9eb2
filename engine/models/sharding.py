"""How a Llama-family checkpoint splits over tensor-parallel ranks (Megatron's layout).

Each rank holds 1/N of the attention heads (and so of the KV cache) and of the MLP's
intermediate columns:

- column-parallel, split by output rows: q/k/v (whole heads each: the rows are laid out
  head by head) and gate/up, with their biases; where a checkpoint fuses them (Phi-3's
  qkv_proj and gate_up_proj), each part is split so, and a rank's parts joined again;
- row-parallel, split by input columns: o_proj and down_proj. Each rank's product is a
  partial sum of the full one, so the model all-reduces after them; their bias is added
  once, by rank 0 (the other ranks hold zeros);
- vocabulary-parallel: the embedding and lm_head by vocabulary rows, padded with zero
  rows to a multiple of N. A rank looks up the tokens in its range (zeros elsewhere,
  then all-reduced), and computes its range of logits (then all-gathered).

The norms are replicated. The checkpoint is read whole on every rank and cut here,
before the model takes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from hetero_infer.engine.settings.exceptions import ConfigError

if TYPE_CHECKING:  # the models import this module
    from hetero_infer.engine.models.config import ModelConfig

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
VOCAB_PARALLEL = ("embed_tokens", "lm_head")


def check_divisible(config: ModelConfig, world_size: int) -> None:
    """ConfigError naming the numbers when the heads or the MLP do not split evenly
    (the vocabulary is padded, so it always does); ConfigError for a mixture-of-experts
    model, whose experts are not split over ranks yet."""
    if config.moe is not None and world_size > 1:
        raise ConfigError(
            f"tensor_parallel_size {world_size}: {config.architecture} is a mixture-of-experts "
            "model, and tensor parallelism does not split expert layers over ranks yet; run "
            "it with tensor_parallel_size 1"
        )
    sizes = {
        "attention heads": config.num_heads,
        "KV heads": config.num_kv_heads,
        "intermediate size": config.intermediate_size,
    }
    uneven = {name: size for name, size in sizes.items() if size % world_size}
    if uneven:
        found = ", ".join(f"{name} ({size})" for name, size in uneven.items())
        raise ConfigError(
            f"tensor_parallel_size {world_size} must divide the model's attention heads, KV "
            f"heads and intermediate size; it does not divide its {found}"
        )


def padded_vocab_shard(vocab_size: int, world_size: int) -> int:
    """Vocabulary rows per rank: the vocabulary padded up to a multiple of world_size."""
    return -(-vocab_size // world_size)


def shard_config(config: ModelConfig, world_size: int) -> ModelConfig:
    """One rank's share of the model: the shapes its layers are built with."""
    check_divisible(config, world_size)
    return dataclasses.replace(
        config,
        num_heads=config.num_heads // world_size,
        num_kv_heads=config.num_kv_heads // world_size,
        intermediate_size=config.intermediate_size // world_size,
        vocab_size=padded_vocab_shard(config.vocab_size, world_size),
    )


def shard_state_dict(
    state_dict: dict[str, torch.Tensor],
    rank: int,
    world_size: int,
    config: ModelConfig | None = None,
    keep_whole: Callable[[str], bool] = lambda name: False,
) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s share of each Hugging Face-named tensor (views where it can);
    ``config`` gives the parts of fused projections; the tensors ``keep_whole`` names
    (a vision model's vision side) stay whole on every rank."""
    fused = {} if config is None else fused_parts(config)
    shards: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        if keep_whole(name):
            shards[name] = tensor
            continue
        if not isinstance(tensor, torch.Tensor):
            raise ConfigError(
                f"{name}: tensor parallelism splits float weights, not quantized blocks; "
                "use quantization 'none' to dequantize them at load"
            )
        module = name.rsplit(".", 2)[-2]
        if module in fused:
            parts = tensor.split(fused[module], dim=0)
            shards[name] = torch.cat([p.chunk(world_size, dim=0)[rank] for p in parts])
            continue
        shards[name] = shard_tensor(name, tensor, rank, world_size)
    return shards


def fused_parts(config: ModelConfig) -> dict[str, list[int]]:
    """The rows of each part of a fused projection: q, k, v; gate, up."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    inter = config.intermediate_size
    return {"qkv_proj": [q, kv, kv], "gate_up_proj": [inter, inter]}


def shard_tensor(name: str, tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    module = name.rsplit(".", 2)[-2]  # "model.layers.0.self_attn.q_proj.weight" -> "q_proj"
    is_bias = name.endswith(".bias")
    if module in COLUMN_PARALLEL:
        return tensor.chunk(world_size, dim=0)[rank]
    if module in ROW_PARALLEL:
        if is_bias:
            return tensor if rank == 0 else torch.zeros_like(tensor)
        return tensor.chunk(world_size, dim=1)[rank]
    if module in VOCAB_PARALLEL:
        rows = padded_vocab_shard(tensor.shape[0], world_size)
        start = min(rank * rows, tensor.shape[0])
        shard = tensor[start : start + rows]
        if shard.shape[0] < rows:  # the last rank's padding
            padding = tensor.new_zeros((rows - shard.shape[0], *tensor.shape[1:]))
            shard = torch.cat([shard, padding])
        return shard
    return tensor
