"""The int8 KV cache's memory: its blocks (values and scales) against the model dtype's,
how many fit a budget, and block copies that move scales with the values."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.engine.core.step_data import BlockMoves
from hetero_infer.engine.settings import choices
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.engine.setup import resolve_kv_cache_dtype
from hetero_infer.engine.worker.kv_cache import KVCache, bytes_per_block
from hetero_infer.engine.worker.kv_sizing import pool_sizes
from hetero_infer.kernels.kv_quant import KV_CACHE_DTYPES, stored_head_size, to_cache

# (layers, KV heads, head_dim): SmolLM2-135M, Gemma-3-270M
MODELS = {"smollm2": (30, 3, 64), "gemma3-270m": (18, 1, 256)}


def block_bytes(model: str, dtype: torch.dtype) -> int:
    layers, kv_heads, head_dim = MODELS[model]
    return bytes_per_block(layers, (16, kv_heads, stored_head_size(head_dim, dtype)), dtype)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_int8_fits_at_least_1_8x_the_tokens_of_bf16(model):
    config = EngineConfig(kv_cache_memory=512 * 2**20)
    one_whole_group = (None,)
    (bf16_blocks,) = pool_sizes(
        config, lambda: 512 * 2**20, [block_bytes(model, torch.bfloat16)], one_whole_group
    )
    (int8_blocks,) = pool_sizes(
        config, lambda: 512 * 2**20, [block_bytes(model, torch.int8)], one_whole_group
    )
    # head_dim 64: 128 bytes a row become 64 + 4 (1.88x); 256: 512 become 260 (1.97x)
    assert int8_blocks / bf16_blocks >= 1.8, (int8_blocks, bf16_blocks)


def test_int8_block_counts_its_scales():
    layers, kv_heads, head_dim = MODELS["smollm2"]
    assert block_bytes("smollm2", torch.int8) == 2 * layers * 16 * kv_heads * (head_dim + 4)


def test_block_copies_move_scales_with_values():
    cache = KVCache(
        2, 6, 4, (16, 3, stored_head_size(64, torch.int8)), torch.int8, torch.device("cpu")
    )
    rows = to_cache(torch.randn(2, 2, 6, 16, 3, 64), torch.int8)
    cache.device_blocks.copy_(rows)
    cache.copy_blocks(BlockMoves(swap_out=[(1, 0)], copy=[(2, 5)]))
    assert torch.equal(cache.cpu_blocks[:, :, 0], rows[:, :, 1])  # scales included
    assert torch.equal(cache.device_blocks[:, :, 5], rows[:, :, 2])


def test_settings_and_checks():
    assert choices.KV_CACHE_DTYPES == KV_CACHE_DTYPES
    assert EngineConfig(kv_cache_dtype="int8").kv_cache_dtype == "int8"
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int4")
    cpu = torch.device("cpu")
    assert resolve_kv_cache_dtype("auto", cpu, torch.bfloat16) == torch.bfloat16
    assert resolve_kv_cache_dtype("int8", cpu, torch.float32) == torch.int8
    with pytest.raises(ConfigError, match="--kv-cache-dtype fp8"):
        resolve_kv_cache_dtype("fp8", cpu, torch.bfloat16)
