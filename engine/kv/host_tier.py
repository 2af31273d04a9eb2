"""The RAM tier's byte mover for one KV cache group: host slots of whole blocks, filled
from device blocks as the pool evicts them, written through to the disk tier, read
back from it, and copied into fresh device blocks when a lookup takes them. Blocks
computed into the prefix cache go to the disk tier too, copied off their device
blocks; the disk writer (disk_writer.py) writes both kinds off the step.

A slot holds a block of every layer of the group contiguously ([layers, 2, block_size,
kv_heads, head_dim]): one slot is one file's payload, read and written in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hetero_infer.engine.core.step_data import TierMoves
from hetero_infer.engine.kv.disk_tier import DiskTier
from hetero_infer.engine.kv.disk_writer import DiskWriter


@dataclass
class HostCounters:
    bytes_saved: int = 0  # device -> host
    bytes_loaded: int = 0  # host -> device


class HostTier:
    def __init__(
        self,
        group: int,
        num_slots: int,
        num_layers: int,
        block_shape: tuple[int, int, int],
        dtype: torch.dtype,
        disk: DiskTier | None,
        writer: DiskWriter | None,
        pin_memory: bool,
    ) -> None:
        self.group = group
        self.disk = disk
        self.writer = writer
        # [num_slots, num_layers, 2 (k, v), block_size, num_kv_heads, head_dim]
        self.slots = torch.zeros(
            (num_slots, num_layers, 2, *block_shape), dtype=dtype, pin_memory=pin_memory
        )
        self.slot_bytes = self.slots[0].numel() * self.slots.element_size()
        self.counters = HostCounters()

    def save(self, device_blocks: torch.Tensor, moves: TierMoves) -> list[tuple[int, int, bool]]:
        """Everything that reads device blocks or fills host slots, before the step
        writes into any block: evicted blocks to their slots, copies of computed blocks
        and of those slots for the disk writer, then the disk reads. Returns each
        read's (group, hash, whether good)."""
        if moves.save:
            blocks, slots = zip(*moves.save, strict=True)
            # device [layers, 2, blocks, ...] -> host [slots, layers, 2, ...]
            self.slots[list(slots)] = device_blocks[:, :, list(blocks)].movedim(2, 0).cpu()
            self.counters.bytes_saved += len(slots) * self.slot_bytes
        if self.writer is not None:
            for block_id, block_hash, token_ids in moves.persist:
                copy = torch.empty_like(self.slots[0]).copy_(device_blocks[:, :, block_id])
                self.writer.submit(self.group, block_hash, token_ids, copy)
            for slot, block_hash, token_ids in moves.write:
                self.writer.submit(self.group, block_hash, token_ids, self.slots[slot].clone())
        results = []
        if self.disk is not None:
            for slot, block_hash, token_ids in moves.read:
                ok = self.disk.read(self.group, block_hash, token_ids, self._payload(slot))
                results.append((self.group, block_hash, ok))
        return results

    def load(self, device_blocks: torch.Tensor, moves: TierMoves) -> None:
        """Host slots into the fresh device blocks a lookup gave them."""
        if not moves.load:
            return
        slots, blocks = zip(*moves.load, strict=True)
        values = self.slots[list(slots)].movedim(0, 2)  # -> [layers, 2, blocks, ...]
        device_blocks[:, :, list(blocks)] = values.to(device_blocks.device)
        self.counters.bytes_loaded += len(slots) * self.slot_bytes

    def _payload(self, slot: int) -> memoryview:
        """The slot's bytes, in place (a file's payload is read straight into them)."""
        return memoryview(self.slots[slot].view(torch.uint8).reshape(-1).numpy())
