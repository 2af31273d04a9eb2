"""The worker's tiers, built once from the settings: a host buffer per KV cache group
(host_tier.py) over one disk directory (disk_tier.py) and its writer thread
(disk_writer.py), and their counters."""

from __future__ import annotations

import logging
from typing import Any

import torch
from hetero_infer.engine.kv.disk_changes import DiskChanges
from hetero_infer.engine.kv.disk_layout import DiskLayout
from hetero_infer.engine.kv.disk_tier import DiskTier
from hetero_infer.engine.kv.disk_writer import DiskWriter
from hetero_infer.engine.kv.fingerprint import kv_fingerprint
from hetero_infer.engine.kv.host_tier import HostTier
from hetero_infer.engine.setup import EngineSetup

logger = logging.getLogger(__name__)

GIB = 1024**3


class TierStore:
    def __init__(
        self, hosts: list[HostTier], disk: DiskTier | None, writer: DiskWriter | None
    ) -> None:
        self.hosts = hosts
        self.disk = disk
        self.writer = writer
        self.num_slots = hosts[0].slots.shape[0]

    @property
    def layout(self) -> DiskLayout | None:
        return self.disk.layout if self.disk is not None else None

    @property
    def disk_changes(self) -> DiskChanges | None:
        return self.disk.changes if self.disk is not None else None

    def close(self, timeout: float) -> None:
        """The disk writes queued, made within ``timeout`` seconds (a stop's)."""
        if self.writer is not None:
            self.writer.close(timeout)

    def stats(self) -> dict[str, Any]:
        stats = {
            "kv_tier_ram_slots": self.num_slots,
            "kv_tier_ram_bytes_saved": sum(h.counters.bytes_saved for h in self.hosts),
            "kv_tier_ram_bytes_loaded": sum(h.counters.bytes_loaded for h in self.hosts),
        }
        if self.disk is not None and self.writer is not None:
            c = self.disk.counters
            stats.update(
                kv_tier_disk_writes_dropped=self.writer.dropped,
                kv_tier_disk_bytes_written=c.bytes_written,
                kv_tier_disk_bytes_read=c.bytes_read,
                kv_tier_disk_write_errors=c.write_errors,
                kv_tier_disk_corrupt_files=c.corrupt_files,
                kv_tier_disk_used_bytes=self.disk.used,
            )
        return stats


def build_tier_store(
    setup: EngineSetup,
    group_layers: list[int],
    block_shape: tuple[int, int, int],
    device: torch.device,
) -> TierStore | None:
    """The tiers the settings ask for (None: none). ``group_layers``: the layers of each
    KV cache group, global first; a slot of each group holds one logical block."""
    config = setup.config
    if not config.kv_offloading_size:
        return None
    # The cache's own element type: an int8 cache's rows carry their scales (block_shape's
    # head size counts them).
    element = torch.tensor([], dtype=setup.kv_cache_dtype).element_size()
    per_block = [
        2 * n * block_shape[0] * block_shape[1] * block_shape[2] * element for n in group_layers
    ]
    num_slots = int(config.kv_offloading_size * GIB) // sum(per_block)
    if num_slots < 1:
        raise ValueError(
            f"kv_offloading_size: {config.kv_offloading_size} GiB holds no block "
            f"({sum(per_block)} bytes each)"
        )
    disk = writer = None
    if config.kv_offloading_dir is not None:
        fingerprint = kv_fingerprint(
            setup.source.path,
            setup.model_config,
            f"{setup.dtype}/{setup.kv_cache_dtype}",
            config.quantization,
            config.block_size,
            [(n, block_shape[1], block_shape[2]) for n in group_layers],
            config.mm_processor_kwargs,
        )
        layout = DiskLayout(config.kv_offloading_dir, fingerprint)
        disk = DiskTier(layout, int(config.kv_offloading_dir_size * GIB))
        writer = DiskWriter(disk)
        logger.info("KV disk tier: %s (fingerprint %s)", layout.folder, fingerprint)
    pin = device.type == "cuda"
    hosts = [
        HostTier(g, num_slots, n, block_shape, setup.kv_cache_dtype, disk, writer, pin)
        for g, n in enumerate(group_layers)
    ]
    logger.info("KV RAM tier: %d blocks (%.1f MiB)", num_slots, num_slots * sum(per_block) / 2**20)
    return TierStore(hosts, disk, writer)
