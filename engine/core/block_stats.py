"""The block manager's counts, as LLMEngine.memory_stats reports them: the first KV
cache group's blocks (which hold every computed token), swapping, the prefix cache's
lookups, and each later group's blocks."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from hetero_infer.engine.core.kv_cache_group import KVCacheGroup


def block_stats(
    groups: Seq[KVCacheGroup], swapped_out_blocks: int, prefix_queries: int, prefix_hits: int
) -> dict[str, Any]:
    pool = groups[0].pool  # reserves no block: its blocks are all in circulation
    stats = {
        "total_blocks": pool.num_blocks,
        "used_blocks": pool.num_used_blocks,
        "free_blocks": pool.num_free_blocks,
        "usage": pool.num_used_blocks / pool.num_blocks,
        "cached_blocks": len(pool.cached_blocks),
        "cpu_total_blocks": pool.num_cpu_blocks,
        "cpu_used_blocks": pool.num_cpu_blocks - len(pool.free_cpu_blocks),
        "swapped_out_blocks": swapped_out_blocks,
        "prefix_cache_queries": prefix_queries,
        "prefix_cache_hits": prefix_hits,
        "prefix_cache_hit_rate": prefix_hits / prefix_queries if prefix_queries else 0.0,
    }
    for group in groups[1:]:  # e.g. "group1_used_blocks"
        pool = group.pool
        stats[f"group{group.index}_total_blocks"] = pool.num_blocks - pool.num_reserved
        stats[f"group{group.index}_used_blocks"] = pool.num_used_blocks
    return stats
