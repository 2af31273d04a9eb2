"""The paged KV cache of every layer, and the CPU blocks that swapped-out sequences keep.

The scheduler decides which blocks move; this applies its copies before a step's
forward pass. An int8 cache keeps each row's scales inside the row (kernels/kv_quant.py),
so a block's copy or swap moves its scales with it. A model whose sliding-window layers
have a KV cache group of their own (core/kv_cache_group.py) has one of these per group,
each over its layers.
"""

from __future__ import annotations

import torch
from hetero_infer.engine.core.step_data import BlockMoves, SchedulerOutput
from hetero_infer.engine.host_memory import zeros_on_huge_pages
from hetero_infer.engine.kv.tier_store import TierStore

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


def sliding_group_window(layer_windows: tuple[int | None, ...]) -> int | None:
    """The window of the sliding-window layers' own KV cache group, or None where the
    model has none: its layers all attend globally, or all slide (a sliding group needs
    the global one's tables beside it, which then hold no KV; such a model keeps one
    group). Different windows share the group, sized by the widest."""
    windows = [w for w in layer_windows if w is not None]
    if not windows or len(windows) == len(layer_windows):
        return None
    return max(windows)


def in_sliding_group(layer_windows: tuple[int | None, ...]) -> list[bool]:
    """Per layer, whether its KV is in the sliding-window layers' own group."""
    own_group = sliding_group_window(layer_windows) is not None
    return [own_group and w is not None for w in layer_windows]


class ModelKVCache:
    """Every layer's KV cache, by KV cache group: the global layers' blocks, and where
    the sliding-window layers have a group of their own, theirs (core/kv_cache_group.py)."""

    def __init__(
        self,
        layer_windows: tuple[int | None, ...],
        num_blocks: int,
        num_sliding_blocks: int,
        num_cpu_blocks: int,
        block_shape: tuple[int, int, int],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        sliding = in_sliding_group(layer_windows)
        own_group = any(sliding)
        self.global_cache = KVCache(
            sliding.count(False), num_blocks, num_cpu_blocks, block_shape, dtype, device
        )
        self.sliding_cache = None
        if own_group:
            # Block 0 of each pool is the null block (core/block_pool.py).
            self.sliding_cache = KVCache(
                sliding.count(True),
                num_sliding_blocks,
                num_cpu_blocks + 1,
                block_shape,
                dtype,
                device,
            )
        global_layers = iter(self.global_cache.layers)
        sliding_layers = iter(self.sliding_cache.layers if self.sliding_cache else ())
        self.layers = [next(sliding_layers if s else global_layers) for s in sliding]
        # The prefix cache's RAM and disk tiers (engine/kv/), where there are any.
        self.tiers: TierStore | None = None

    @property
    def group_layers(self) -> list[int]:
        """The layers of each KV cache group, global first."""
        caches = [self.global_cache, self.sliding_cache]
        return [len(c.layers) for c in caches if c is not None]

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
        caches = [(self.global_cache, out.global_moves)]
        if self.sliding_cache is not None:
            caches.append((self.sliding_cache, out.sliding_moves))
        for group, (cache, moves) in enumerate(caches):
            tier = tier_moves.get(group)
            host = self.tiers.hosts[group] if self.tiers is not None and tier else None
            if host is not None:
                reads += host.save(cache.device_blocks, tier)
            cache.swap_out(moves)
            if host is not None:
                host.load(cache.device_blocks, tier)
            cache.copy_in(moves)
        return tuple(reads)
