"""How many KV blocks the cache gets where max_num_blocks does not say: on the CPU,
kv_cache_memory's bytes; on CUDA, what gpu_memory_utilization leaves of the device
after the weights and the largest step's activations (measured by running one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from hetero_infer.engine.models import CausalLM
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import OutOfMemoryError
from hetero_infer.engine.worker.input_batch import InputBatcher
from hetero_infer.engine.worker.kv_cache import layer_caches

logger = logging.getLogger(__name__)


def kv_cache_budget(
    config: EngineConfig, device: torch.device, profile_step_memory: Callable[[], int]
) -> int:
    """The KV cache's memory budget in bytes (``profile_step_memory``: the largest
    step's peak bytes, asked for on CUDA only)."""
    if device.type != "cuda":
        return config.kv_cache_memory
    # What the largest step needs on top of the weights, measured, then what the
    # device holds now (weights, CUDA context, other processes).
    activations = profile_step_memory()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    budget = int(total * config.gpu_memory_utilization) - used - activations
    logger.info(
        "memory: %.2f GiB in use, %.2f GiB peak for a %d-token step, %.2f GiB of "
        "%.2f GiB for the KV cache",
        used / 2**30,
        activations / 2**30,
        config.max_num_batched_tokens,
        max(budget, 0) / 2**30,
        total / 2**30,
    )
    return budget


def windowed_blocks_needed(config: EngineConfig, window: int) -> int:
    """The most blocks a windowed KV cache group holds for running sequences, its null
    block included: per sequence the window's blocks and the one after them, and its
    prompt's last window (core/kv_cache_group.py), plus the step's new tokens."""
    bs = config.block_size
    per_sequence = 2 * -(-(window - 1) // bs) + 2
    return 1 + config.max_num_seqs * per_sequence + -(-config.max_num_batched_tokens // bs)


def pool_sizes(
    config: EngineConfig,
    budget: Callable[[], int],
    group_block_bytes: Sequence[int],
    group_windows: Sequence[int | None],
) -> list[int]:
    """The blocks of each KV cache group (engine/models/kv_layout.py), given the bytes
    of one block of each. max_num_blocks sets the first group's pool, else the budget
    does. A windowed group gets what its running sequences can ever hold, never more
    blocks than the first group plus its null block (it holds fewer of each
    sequence's); every whole group as many as the first, the most that fit beside
    them: their tokens are what bounds how many a server can hold at once."""
    caps = [None if w is None else windowed_blocks_needed(config, w) for w in group_windows]

    def sizes(num_blocks: int) -> list[int]:
        return [num_blocks if cap is None else min(num_blocks + 1, cap) for cap in caps]

    def cost(num_blocks: int) -> int:
        return sum(n * b for n, b in zip(sizes(num_blocks), group_block_bytes, strict=True))

    if config.max_num_blocks:
        return sizes(config.max_num_blocks)
    total = budget()
    # The most blocks that fit: the cost grows with the count, so a bisection finds it.
    low, high = 0, max(0, total) // group_block_bytes[0]
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if cost(middle) <= total else (low, middle - 1)
    if low < 1:
        raise OutOfMemoryError(
            f"no memory left for the KV cache (budget {total} bytes, one block needs "
            f"{cost(1)}); raise kv_cache_memory or gpu_memory_utilization"
        )
    return sizes(low)


@torch.inference_mode()
def profile_step_memory(
    model: CausalLM,
    inputs: InputBatcher,
    config: EngineConfig,
    max_model_len: int,
    block_shape: tuple[int, int, int],
    dtype: torch.dtype,
) -> int:
    """Peak bytes allocated by the largest step: a forward pass over
    max_num_batched_tokens prompt tokens, and logits for max_num_seqs of them. The
    throwaway KV cache it writes to is not counted."""
    device = inputs.device
    num_tokens = config.max_num_batched_tokens
    seq_len = min(num_tokens, max_model_len)
    lens = [seq_len] * (num_tokens // seq_len)
    if num_tokens % seq_len:
        lens.append(num_tokens % seq_len)
    num_blocks = sum(-(-n // config.block_size) for n in lens)
    cache = torch.zeros((model.num_layers, 2, num_blocks, *block_shape), dtype=dtype, device=device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    batch = inputs.synthetic([(0, n) for n in lens])
    hidden = model(batch.input_ids, batch.positions, layer_caches(cache), batch.meta)
    rows = min(config.max_num_seqs, num_tokens)
    logits = model.compute_logits(hidden[:rows])
    logits.float().softmax(-1).sort(-1)  # the sampler's top-p holds about this much
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del cache, batch, hidden, logits
    return peak
