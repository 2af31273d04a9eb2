"""The paged KV cache of every layer, and the CPU blocks that swapped-out sequences keep.

The scheduler decides which blocks move; this applies its copies before a step's
forward pass. An int8 cache keeps each row's scales inside the row (kernels/kv_quant.py),
so a block's copy or swap moves its scales with it. A model with more than one KV cache
group (engine/models/kv_layout.py) has one of these per group, each over its layers.
"""

from __future__ import annotations

import torch
from hetero_infer.engine.core.step_data import BlockMoves, SchedulerOutput
from hetero_infer.engine.kv.tier_store import TierStore
from hetero_infer.engine.models.kv_layout import KVLayout
from hetero_infer.engine.settings.host_memory import zeros_on_huge_pages

LayerCache = tuple[torch.Tensor, torch.Tensor]  # (k_cache, v_cache) of one layer


def bytes_per_block(num_layers: int, block_shape: tuple[int, int, int], dtype: torch.dtype) -> int:
    """Keys and values of one block in every layer; block_shape is (block_size,
    num_kv_heads, the elements a token's head takes: head_dim, plus the bytes of its
    scales in an int8 cache), so the scales are counted with the values."""
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

    def prefault(self) -> None:
        """Write every block once (zeros), so that none is faulted in when first used."""
        self.device_blocks.zero_()

    def copy_blocks(self, moves: BlockMoves) -> None:
        # Order matters: a block swapped out may be handed to a swap-in or a copy
        # in the same step.
        self.swap_out(moves)
        self.copy_in(moves)

    def swap_out(self, moves: BlockMoves) -> None:
        if moves.swap_out:
            src, dst = zip(*moves.swap_out, strict=True)
            self.cpu_blocks[:, :, list(dst)] = self.device_blocks[:, :, list(src)].cpu()

    def copy_in(self, moves: BlockMoves) -> None:
        """The swap-ins, then the copies (a block a copy reads may just have come in)."""
        gpu, cpu = self.device_blocks, self.cpu_blocks
        if moves.swap_in:
            src, dst = zip(*moves.swap_in, strict=True)
            gpu[:, :, list(dst)] = cpu[:, :, list(src)].to(self.device)
        if moves.copy:
            src, dst = zip(*moves.copy, strict=True)
            gpu[:, :, list(dst)] = gpu[:, :, list(src)]


def layer_caches(kv_cache: torch.Tensor) -> list[LayerCache]:
    # [num_layers, 2, num_blocks, ...] -> per layer (k_cache, v_cache)
    return [(kv_cache[i, 0], kv_cache[i, 1]) for i in range(kv_cache.shape[0])]


class ModelKVCache:
    """Every layer's KV cache, by KV cache group (engine/models/kv_layout.py): each
    group's blocks over its layers."""

    def __init__(
        self,
        layout: KVLayout,
        group_blocks: list[int],
        num_cpu_blocks: int,
        block_shape: tuple[int, int, int],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.groups = [
            # A windowed group's pool has a null block (core/block_pool.py): one more
            # CPU block too.
            KVCache(
                layout.num_layers_in(group),
                num_blocks,
                num_cpu_blocks + (window is not None),
                block_shape,
                dtype,
                device,
            )
            for group, (window, num_blocks) in enumerate(
                zip(layout.group_windows, group_blocks, strict=True)
            )
        ]
        group_layers = [iter(cache.layers) for cache in self.groups]
        self.layers = [next(group_layers[group]) for group in layout.layer_groups]
        # The prefix cache's RAM and disk tiers (engine/kv/), where there are any.
        self.tiers: TierStore | None = None

    @property
    def group_layers(self) -> list[int]:
        """The layers of each KV cache group."""
        return [len(cache.layers) for cache in self.groups]

    def prefault(self) -> None:
        """Every group's blocks written once (the kv_cache_prefault setting)."""
        for cache in self.groups:
            cache.prefault()

    def close_tiers(self, timeout: float) -> None:
        """The disk tier's queued writes, made within ``timeout`` seconds (a stop's)."""
        if self.tiers is not None:
            self.tiers.close(timeout)

    def copy_blocks(self, out: SchedulerOutput) -> tuple[tuple[int, int, bool], ...]:
        """A step's block moves, per group in an order that reads every block before
        anything writes into it: tier saves (an evicted block, read before it is given
        out again), swap-outs, tier loads, swap-ins, copies. Returns the disk reads'
        outcomes (TierMoves)."""
        tier_moves = {m.group: m for m in out.tier_moves}
        reads: list[tuple[int, int, bool]] = []
        for group, cache in enumerate(self.groups):
            moves = out.group_moves(group)
            tier = tier_moves.get(group)
            host = self.tiers.hosts[group] if self.tiers is not None and tier else None
            if host is not None:
                reads += host.save(cache.device_blocks, tier)
            cache.swap_out(moves)
            if host is not None:
                host.load(cache.device_blocks, tier)
            cache.copy_in(moves)
        return tuple(reads)
