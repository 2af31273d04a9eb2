"""The paged KV cache of every layer, and the CPU blocks that swapped-out sequences keep.

The scheduler decides which blocks move; this applies its copies before a step's
forward pass.
"""

from __future__ import annotations

import torch
from hetero_infer.engine.core.step_data import SchedulerOutput
from hetero_infer.engine.host_memory import zeros_on_huge_pages

LayerCache = tuple[torch.Tensor, torch.Tensor]  # (k_cache, v_cache) of one layer


def bytes_per_block(num_layers: int, block_shape: tuple[int, int, int], dtype: torch.dtype) -> int:
    """Keys and values of one block in every layer; block_shape is (block_size,
    num_kv_heads, head_dim)."""
    elements = 2 * num_layers
    for size in block_shape:
        elements *= size
    return elements * torch.tensor([], dtype=dtype).element_size()


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        num_cpu_blocks: int,
        block_shape: tuple[int, int, int],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        # [num_layers, 2 (k, v), num_blocks, block_size, num_kv_heads, head_dim]
        shape = (num_layers, 2, num_blocks, *block_shape)
        if device.type == "cpu":
            self.device_blocks = zeros_on_huge_pages(shape, dtype)
        else:
            self.device_blocks = torch.zeros(shape, dtype=dtype, device=device)
        self.cpu_blocks = torch.zeros(
            (num_layers, 2, num_cpu_blocks, *block_shape),
            dtype=dtype,
            pin_memory=device.type == "cuda" and num_cpu_blocks > 0,
        )
        self.device = device
        self.layers = layer_caches(self.device_blocks)

    def copy_blocks(self, out: SchedulerOutput) -> None:
        # Order matters: a block swapped out may be handed to a swap-in or a copy
        # in the same step.
        gpu, cpu = self.device_blocks, self.cpu_blocks
        if out.blocks_to_swap_out:
            src, dst = zip(*out.blocks_to_swap_out, strict=True)
            cpu[:, :, list(dst)] = gpu[:, :, list(src)].cpu()
        if out.blocks_to_swap_in:
            src, dst = zip(*out.blocks_to_swap_in, strict=True)
            gpu[:, :, list(dst)] = cpu[:, :, list(src)].to(self.device)
        if out.blocks_to_copy:
            src, dst = zip(*out.blocks_to_copy, strict=True)
            gpu[:, :, list(dst)] = gpu[:, :, list(src)]


def layer_caches(kv_cache: torch.Tensor) -> list[LayerCache]:
    # [num_layers, 2, num_blocks, ...] -> per layer (k_cache, v_cache)
    return [(kv_cache[i, 0], kv_cache[i, 1]) for i in range(kv_cache.shape[0])]
