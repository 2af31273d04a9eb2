"""The prefix cache's tiers' counts (host RAM, disk), as LLMEngine.memory_stats reports
them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TierCounters:
    ram_hits: int = 0  # blocks brought back from host RAM
    ram_misses: int = 0  # blocks a lookup wanted that host RAM did not hold
    disk_hits: int = 0  # blocks read back whole from disk
    disk_misses: int = 0  # blocks wanted and not on disk, or refused as bad files
    saves_dropped: int = 0  # evicted blocks not saved: every host slot was busy
    queried_tokens: int = 0  # tokens admitted sequences asked the tiers for
    hit_tokens: int = 0  # of those, tokens the tiers served

    def stats(self, ram_blocks: int) -> dict[str, int]:
        """The counts by memory_stats' names, with the blocks host RAM holds now."""
        return {
            "kv_tier_ram_hits": self.ram_hits,
            "kv_tier_ram_misses": self.ram_misses,
            "kv_tier_disk_hits": self.disk_hits,
            "kv_tier_disk_misses": self.disk_misses,
            "kv_tier_saves_dropped": self.saves_dropped,
            "kv_tier_queried_tokens": self.queried_tokens,
            "kv_tier_hit_tokens": self.hit_tokens,
            "kv_tier_ram_blocks": ram_blocks,
        }
