"""CUDA graphs of the model's decode steps.

A decode step on a GPU launches hundreds of small kernels; replaying a captured graph
launches them at once. Captured at a set of batch sizes, sharing one memory pool, for
attention backends whose metadata a graph can hold (Triton's: the buffers themselves).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import torch
from hetero_infer.engine.models.protocol import CausalLM, KVCache
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.worker.input_batch import InputBatcher, ModelInputs
from hetero_infer.kernels import AttentionBackend, AttentionInputs

logger = logging.getLogger(__name__)


class RunnerView(Protocol):
    """What the graphs read of the model runner (model_runner.py's ModelRunner, which
    captures them and so imports this module): its model, KV cache and attention
    backend, and the sizes the static buffers take."""

    config: EngineConfig
    device: torch.device
    model: CausalLM
    attention: AttentionBackend
    kv_caches: list[KVCache]
    inputs: InputBatcher
    max_model_len: int
    block_size: int
    num_blocks: int


# Decode batch sizes with a captured graph; a batch runs in the smallest one that fits.
CUDA_GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class DecodeGraphs:
    """CUDA graphs of the model's forward pass for decode steps (one new token per
    sequence) at fixed batch sizes, sharing one memory pool.

    A graph replays fixed kernels on fixed buffers, so every input lives in a static
    buffer sized for the largest batch, and the attention kernels read the per-step
    values (context lengths, block tables) from device memory. The Triton launchers see
    max_context_len = max_model_len at capture, so the flash-decoding split count is
    sized for the longest context; shorter ones leave splits empty. Rows past the real
    batch are padding: slot -1 (nothing stored) and a context of 1.
    """

    def __init__(self, runner: RunnerView, batch_sizes: list[int]) -> None:
        self.runner = runner
        self.batch_sizes = batch_sizes
        device, max_batch = runner.device, batch_sizes[-1]
        self.max_blocks = -(-runner.max_model_len // runner.block_size)
        self.input_ids = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.long, device=device)
        # [max_batch, max_blocks]
        self.block_tables = torch.zeros(
            (max_batch, self.max_blocks), dtype=torch.int32, device=device
        )
        self.context_lens = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # [batch, hidden], in the graphs' pool
        self.pool = None

    @classmethod
    def capture(cls, runner: RunnerView) -> DecodeGraphs | None:
        """Capture graphs for every batch size up to max_num_seqs and check one against
        the eager forward; None (eager decode) if capture fails or the check differs."""
        limit = runner.config.max_num_seqs
        sizes = [b for b in CUDA_GRAPH_BATCH_SIZES if b < limit] + [
            min(limit, CUDA_GRAPH_BATCH_SIZES[-1])
        ]
        graphs = cls(runner, sorted(set(sizes)))
        started = time.monotonic()
        try:
            graphs.pool = torch.cuda.graph_pool_handle()
            with torch.inference_mode():
                for size in reversed(graphs.batch_sizes):  # largest first: the pool fits all
                    graphs._capture(size)
                ok = graphs._matches_eager()
        except Exception as exc:  # graphs only save launch time: never fail start-up
            logger.warning("CUDA graph capture failed, decoding eagerly: %r", exc)
            return None
        if not ok:
            logger.warning("CUDA graph replay differs from the eager forward; decoding eagerly")
            return None
        logger.info(
            "captured decode CUDA graphs for batch sizes %s in %.1f s",
            graphs.batch_sizes,
            time.monotonic() - started,
        )
        return graphs

    def _meta(self, size: int) -> AttentionInputs:
        """The backend's metadata over the static buffers (for Triton, the buffers)."""
        runner = self.runner
        inputs = AttentionInputs(
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            context_lens=self.context_lens[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            max_query_len=1,
            max_context_len=runner.max_model_len,
        )
        return runner.attention.prepare(inputs, runner.block_size, runner.model.sliding_windows)

    def _forward(self, size: int) -> torch.Tensor:
        runner = self.runner
        return runner.model(
            self.input_ids[:size], self.positions[:size], runner.kv_caches, self._meta(size)
        )

    def _capture(self, size: int) -> None:
        self._forward(size)  # warm-up: Triton compiles outside the capture
        torch.cuda.synchronize(self.runner.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[size] = self._forward(size)
        self.graphs[size] = graph

    def _matches_eager(self) -> bool:
        """Replay against the eager forward on made-up decodes. Writing their keys into
        blocks 0.. is harmless: no sequence exists yet, and a sequence only reads
        positions it has written."""
        runner = self.runner
        num_seqs = min(3, self.batch_sizes[-1])
        chunks = [(5 + 7 * i, 1) for i in range(num_seqs)]
        if sum(-(-(c + n) // runner.block_size) for c, n in chunks) > runner.num_blocks:
            return True  # too small a cache to check in; nothing to compare
        inputs = runner.inputs.synthetic(chunks)
        inputs.input_ids.copy_(torch.arange(3, 3 + num_seqs, device=runner.device))
        eager = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta)
        replayed = self.run(inputs).clone()
        return bool(torch.allclose(replayed.float(), eager.float(), rtol=1e-2, atol=1e-2))

    def can_run(self, inputs: ModelInputs) -> bool:
        meta = inputs.meta
        return (
            not inputs.lora_groups  # the graphs were captured without LoRA's updates
            and meta.max_query_len == 1
            and meta.num_seqs == inputs.input_ids.shape[0]
            and meta.num_seqs <= self.batch_sizes[-1]
            and meta.block_tables.shape[1] <= self.max_blocks
        )

    def run(self, inputs: ModelInputs) -> torch.Tensor:
        """Copy the step's inputs into the static buffers, replay; [num_seqs, hidden]."""
        meta = inputs.meta
        n = meta.num_seqs
        size = next(b for b in self.batch_sizes if b >= n)
        self.input_ids[:n].copy_(inputs.input_ids)
        self.positions[:n].copy_(inputs.positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        self.block_tables[:n, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        self.context_lens[:n].copy_(meta.context_lens)
        self.context_lens[n:size].fill_(1)
        self.graphs[size].replay()
        return self.outputs[size][:n]
