"""ModelRunner: owns the weights and KV cache; runs one scheduled step.

This is the one place where the scheduler's Python lists become tensors
(``prepare_inputs``); the rest of the step is block copies, one forward pass for
every scheduled sequence, last-token logits, and sampling.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

import kernels
from engine.config import EngineConfig
from engine.sampler import Sampler
from engine.scheduler import SchedulerOutput
from kernels import AttentionMetadata

logger = logging.getLogger(__name__)


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampled]: the last token of each sampling sequence


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model: torch.nn.Module,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.config = config
        self.model = model
        self.device = device
        self.dtype = dtype
        self.block_size = config.block_size
        self.sampler = Sampler(config.seed)
        hf = model.config
        self.num_layers = hf.num_hidden_layers
        self.kv_block_shape = (config.block_size, model.num_kv_heads, model.head_dim)
        self.num_blocks = config.max_num_blocks or self._blocks_from_budget()
        # [num_layers, 2 (k, v), num_blocks, block_size, num_kv_heads, head_dim]
        self.kv_cache = torch.zeros(
            (self.num_layers, 2, self.num_blocks, *self.kv_block_shape), dtype=dtype, device=device
        )
        self.cpu_kv_cache = torch.zeros(
            (self.num_layers, 2, config.num_cpu_blocks, *self.kv_block_shape),
            dtype=dtype,
            pin_memory=device.type == "cuda" and config.num_cpu_blocks > 0,
        )
        self.kv_caches = [
            (self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(self.num_layers)
        ]

    @property
    def bytes_per_block(self) -> int:
        elements = 2 * self.num_layers
        for size in self.kv_block_shape:
            elements *= size
        return elements * torch.tensor([], dtype=self.dtype).element_size()

    def _blocks_from_budget(self) -> int:
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            budget = int(total * self.config.gpu_memory_utilization) - used
        else:
            budget = self.config.kv_cache_memory
        num_blocks = budget // self.bytes_per_block
        if num_blocks < 1:
            raise ValueError(
                f"no memory left for the KV cache (budget {budget} bytes, one block needs "
                f"{self.bytes_per_block}); raise kv_cache_memory or gpu_memory_utilization"
            )
        return int(num_blocks)

    # ---- one step ----

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[str, tuple[int, float]]:
        """Run a scheduled step; return request_id -> (sampled token, its logprob)."""
        self._copy_blocks(out)
        inputs = self.prepare_inputs(out)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        sampling = [s.seq for s in out.scheduled if s.samples]
        if not sampling:
            return {}
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        tokens, logprobs = self.sampler(logits, sampling)
        return {
            seq.request_id: (tok, lp)
            for seq, tok, lp in zip(sampling, tokens, logprobs, strict=True)
        }

    def prepare_inputs(self, out: SchedulerOutput) -> ModelInputs:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        query_start_loc = [0]
        context_lens: list[int] = []
        logits_indices: list[int] = []
        for item in out.scheduled:
            seq, start = item.seq, item.start
            end = start + item.num_new_tokens
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            table = seq.block_table
            slot_mapping += [table[p // bs] * bs + p % bs for p in range(start, end)]
            query_start_loc.append(query_start_loc[-1] + item.num_new_tokens)
            context_lens.append(end)
            if item.samples:
                logits_indices.append(query_start_loc[-1] - 1)
        max_context_len = max(context_lens)
        max_blocks = -(-max_context_len // bs)
        block_tables = [
            item.seq.block_table[:max_blocks] + [0] * (max_blocks - len(item.seq.block_table))
            for item in out.scheduled
        ]

        def tensor(values: Any, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        meta = AttentionMetadata(
            slot_mapping=tensor(slot_mapping),
            block_tables=tensor(block_tables, torch.int32),
            context_lens=tensor(context_lens, torch.int32),
            query_start_loc=tensor(query_start_loc, torch.int32),
            max_query_len=max(s.num_new_tokens for s in out.scheduled),
            max_context_len=max_context_len,
        )
        kernels.prepare_attention(meta, bs, self.model.sliding_windows)
        return ModelInputs(
            input_ids=tensor(input_ids),
            positions=tensor(positions),
            meta=meta,
            logits_indices=tensor(logits_indices),
        )

    def _copy_blocks(self, out: SchedulerOutput) -> None:
        # Order matters: a block swapped out may be handed to a swap-in or a copy
        # in the same step.
        if out.blocks_to_swap_out:
            src, dst = zip(*out.blocks_to_swap_out, strict=True)
            self.cpu_kv_cache[:, :, list(dst)] = self.kv_cache[:, :, list(src)].cpu()
        if out.blocks_to_swap_in:
            src, dst = zip(*out.blocks_to_swap_in, strict=True)
            self.kv_cache[:, :, list(dst)] = self.cpu_kv_cache[:, :, list(src)].to(self.device)
        if out.blocks_to_copy:
            src, dst = zip(*out.blocks_to_copy, strict=True)
            self.kv_cache[:, :, list(dst)] = self.kv_cache[:, :, list(src)]
