"""ModelRunner: owns the weights and KV cache; runs one scheduled step.

This is the one place where the scheduler's Python lists become tensors
(``prepare_inputs``); the rest of the step is block copies, one forward pass for
every scheduled sequence, last-token logits, and sampling.

The model's attention backend (chosen once, with the model: kernels.select_kernels)
turns each step's inputs into its metadata. On CUDA the KV cache gets the memory that
a profiling forward pass of the largest step leaves under gpu_memory_utilization, and
decode steps replay CUDA graphs captured at a set of batch sizes, where the backend's
metadata allows it (Triton's).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from hetero_infer.engine.config import EngineConfig
from hetero_infer.engine.core.step_data import (
    EMPTY_RUNNER_OUTPUT,
    Logprobs,
    ModelRunnerOutput,
    SampledToken,
    ScheduledSequence,
    SchedulerOutput,
)
from hetero_infer.engine.exceptions import OutOfMemoryError
from hetero_infer.engine.host_memory import zeros_on_huge_pages
from hetero_infer.engine.models import CausalLM
from hetero_infer.engine.sampler import Sampler
from hetero_infer.kernels import AttentionInputs

logger = logging.getLogger(__name__)


# One sequence's share of a step: (new token ids, position of the first, block table,
# whether its last token's logits are kept for sampling).
_Chunk = tuple[list[int], int, list[int], bool]


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    meta: AttentionInputs  # the attention backend's metadata for the step
    logits_indices: torch.Tensor  # [num_sampled]: the last token of each sampling sequence


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model: CausalLM,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.config = config
        self.model = model
        self.device = device
        self.dtype = dtype
        self.block_size = config.block_size
        self.attention = model.kernels.attention
        self.sampler = Sampler(config.seed, model.kernels.ops.greedy_pick)
        self.num_layers = model.num_layers
        self.max_model_len = config.max_model_len or model.config.max_position_embeddings
        self.kv_block_shape = (config.block_size, model.num_kv_heads, model.head_dim)
        self.num_blocks = config.max_num_blocks or self._blocks_from_budget()
        # [num_layers, 2 (k, v), num_blocks, block_size, num_kv_heads, head_dim]
        kv_cache_shape = (self.num_layers, 2, self.num_blocks, *self.kv_block_shape)
        if device.type == "cpu":
            self.kv_cache = zeros_on_huge_pages(kv_cache_shape, dtype)
        else:
            self.kv_cache = torch.zeros(kv_cache_shape, dtype=dtype, device=device)
        self.cpu_kv_cache = torch.zeros(
            (self.num_layers, 2, config.num_cpu_blocks, *self.kv_block_shape),
            dtype=dtype,
            pin_memory=device.type == "cuda" and config.num_cpu_blocks > 0,
        )
        self.kv_caches = _layer_caches(self.kv_cache)
        self.graphs: DecodeGraphs | None = None
        # Graphs are only ever used on CUDA, with a backend whose metadata they can hold.
        graphs_fit = device.type == "cuda" and self.attention.supports_cuda_graphs
        if not config.enforce_eager and graphs_fit:
            self.graphs = DecodeGraphs.capture(self)

    @property
    def bytes_per_block(self) -> int:
        elements = 2 * self.num_layers
        for size in self.kv_block_shape:
            elements *= size
        return elements * torch.tensor([], dtype=self.dtype).element_size()

    def _blocks_from_budget(self) -> int:
        if self.device.type == "cuda":
            # What the largest step needs on top of the weights, measured, then what
            # the device holds now (weights, CUDA context, other processes).
            activations = self._profile_step_memory()
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            budget = int(total * self.config.gpu_memory_utilization) - used - activations
            logger.info(
                "memory: %.2f GiB in use, %.2f GiB peak for a %d-token step, %.2f GiB of "
                "%.2f GiB for the KV cache",
                used / 2**30,
                activations / 2**30,
                self.config.max_num_batched_tokens,
                max(budget, 0) / 2**30,
                total / 2**30,
            )
        else:
            budget = self.config.kv_cache_memory
        num_blocks = budget // self.bytes_per_block
        if num_blocks < 1:
            raise OutOfMemoryError(
                f"no memory left for the KV cache (budget {budget} bytes, one block needs "
                f"{self.bytes_per_block}); raise kv_cache_memory or gpu_memory_utilization"
            )
        return int(num_blocks)

    @torch.inference_mode()
    def _profile_step_memory(self) -> int:
        """Peak bytes allocated by the largest step: a forward pass over
        max_num_batched_tokens prompt tokens, and logits for max_num_seqs of them. The
        throwaway KV cache it writes to is not counted."""
        num_tokens = self.config.max_num_batched_tokens
        seq_len = min(num_tokens, self.max_model_len)
        lens = [seq_len] * (num_tokens // seq_len)
        if num_tokens % seq_len:
            lens.append(num_tokens % seq_len)
        num_blocks = sum(-(-n // self.block_size) for n in lens)
        cache = torch.zeros(
            (self.num_layers, 2, num_blocks, *self.kv_block_shape),
            dtype=self.dtype,
            device=self.device,
        )
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        inputs = self.synthetic_inputs([(0, n) for n in lens])
        hidden = self.model(inputs.input_ids, inputs.positions, _layer_caches(cache), inputs.meta)
        rows = min(self.config.max_num_seqs, num_tokens)
        logits = self.model.compute_logits(hidden[:rows])
        logits.float().softmax(-1).sort(-1)  # the sampler's top-p holds about this much
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        del cache, inputs, hidden, logits
        return peak

    def synthetic_inputs(self, chunks: list[tuple[int, int]]) -> ModelInputs:
        """Inputs for made-up sequences, one per (cached tokens, new tokens), on blocks
        0, 1, 2, ... in order (for profiling, warm-up and checks; token ids are 0)."""
        items: list[_Chunk] = []
        next_block = 0
        for cached, new in chunks:
            num_blocks = -(-(cached + new) // self.block_size)
            table = list(range(next_block, next_block + num_blocks))
            next_block += num_blocks
            items.append(([0] * new, cached, table, True))
        return self._build_inputs(items)

    # ---- one step ----

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run a scheduled step: block copies, one forward pass, prompt logprobs and
        sampling. Reads only ``out`` (plain data), so it may run in any thread."""
        self.sampler.forget(out.finished)
        if out.is_empty:
            return EMPTY_RUNNER_OUTPUT
        self._copy_blocks(out)
        inputs = self.prepare_inputs(out)
        if self.graphs is not None and self.graphs.can_run(inputs):
            hidden = self.graphs.run(inputs)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        prompt_logprobs = self._prompt_logprobs(out, hidden)
        sampling = [s for s in out.scheduled if s.samples]
        if not sampling:
            return ModelRunnerOutput({}, prompt_logprobs)
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        tokens, logprobs, tops = self.sampler(logits, sampling)
        sampled = {
            s.request_id: SampledToken(tok, lp, top)
            for s, tok, lp, top in zip(sampling, tokens, logprobs, tops, strict=True)
        }
        return ModelRunnerOutput(sampled, prompt_logprobs)

    def _prompt_logprobs(
        self, out: SchedulerOutput, hidden: torch.Tensor
    ) -> dict[str, list[Logprobs]]:
        """Each sequence's logprobs for the prompt positions this step computed.

        Position p's logits predict prompt token p + 1. Only positions past those the
        sequence has (a recomputed prompt would repeat them). These are the model's raw
        logprobs, as vLLM gives prompt logprobs.
        """
        rows: list[int] = []
        targets: list[tuple[ScheduledSequence, int]] = []  # (sequence, prompt token predicted)
        offset = 0
        for item in out.scheduled:
            have = item.num_prompt_logprobs
            if have is not None and item.prompt_token_ids is not None:
                num_prompt = len(item.prompt_token_ids)
                assert item.start + 1 <= have or item.start >= num_prompt
                for p in range(item.start, item.start + item.num_new_tokens):
                    if have <= p + 1 < num_prompt:
                        rows.append(offset + p - item.start)
                        targets.append((item, p + 1))
            offset += item.num_new_tokens
        if not rows:
            return {}
        logprobs = torch.log_softmax(
            self.model.compute_logits(hidden[rows]).float(), dim=-1
        ).cpu()  # [len(rows), vocab]
        token_ids = torch.tensor([item.prompt_token_ids[i] for item, i in targets])
        chosen = logprobs.gather(1, token_ids[:, None]).squeeze(1).tolist()
        k_max = max(item.sampling_params.prompt_logprobs or 0 for item, _ in targets)
        top_values, top_ids = logprobs.topk(max(k_max, 1), dim=-1)
        found: dict[str, list[Logprobs]] = {}
        for j, (item, i) in enumerate(targets):
            k = item.sampling_params.prompt_logprobs or 0
            entry = {item.prompt_token_ids[i]: chosen[j]}
            top = zip(top_ids[j, :k].tolist(), top_values[j, :k].tolist(), strict=True)
            for token_id, value in top:
                entry.setdefault(token_id, value)
            found.setdefault(item.request_id, []).append(entry)
        return found

    def prepare_inputs(self, out: SchedulerOutput) -> ModelInputs:
        return self._build_inputs(
            [(item.token_ids, item.start, item.block_table, item.samples) for item in out.scheduled]
        )

    def _build_inputs(self, chunks: list[_Chunk]) -> ModelInputs:
        """Pack the chunks into the step's tensors: numpy over all tokens at once (a
        Python loop runs per sequence, for its token ids and block table, never per
        token), handed to torch without copies on the CPU."""
        bs = self.block_size
        num_seqs = len(chunks)
        query_lens = np.fromiter((len(c[0]) for c in chunks), np.int64, num_seqs)
        starts = np.fromiter((c[1] for c in chunks), np.int64, num_seqs)
        query_start_loc = np.zeros(num_seqs + 1, np.int64)
        np.cumsum(query_lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        input_ids = np.fromiter(itertools.chain.from_iterable(c[0] for c in chunks), np.int64)
        # The sequence each token belongs to, and its absolute position there.
        token_seq = np.repeat(np.arange(num_seqs), query_lens)
        positions = np.arange(num_tokens) - (query_start_loc[:-1] - starts)[token_seq]
        context_lens = starts + query_lens
        max_context_len = int(context_lens.max())
        max_blocks = -(-max_context_len // bs)
        block_tables = np.zeros((num_seqs, max_blocks), np.int32)
        for row, (_, _, table, _) in zip(block_tables, chunks, strict=True):
            used = table[:max_blocks]
            row[: len(used)] = used
        slot_mapping = block_tables[token_seq, positions // bs].astype(np.int64) * bs
        slot_mapping += positions % bs
        samples = np.fromiter((c[3] for c in chunks), bool, num_seqs)
        logits_indices = query_start_loc[1:][samples] - 1

        def tensor(values: np.ndarray, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.from_numpy(values).to(self.device, dtype, non_blocking=True)

        attention_inputs = AttentionInputs(
            slot_mapping=tensor(slot_mapping),
            block_tables=tensor(block_tables, torch.int32),
            context_lens=tensor(context_lens, torch.int32),
            query_start_loc=tensor(query_start_loc, torch.int32),
            max_query_len=int(query_lens.max()),
            max_context_len=max_context_len,
        )
        meta = self.attention.prepare(attention_inputs, bs, self.model.sliding_windows)
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


def _layer_caches(kv_cache: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # [num_layers, 2, num_blocks, ...] -> per layer (k_cache, v_cache)
    return [(kv_cache[i, 0], kv_cache[i, 1]) for i in range(kv_cache.shape[0])]


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

    def __init__(self, runner: ModelRunner, batch_sizes: list[int]) -> None:
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
    def capture(cls, runner: ModelRunner) -> DecodeGraphs | None:
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
        inputs = runner.synthetic_inputs(chunks)
        inputs.input_ids.copy_(torch.arange(3, 3 + num_seqs, device=runner.device))
        eager = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta)
        replayed = self.run(inputs).clone()
        return bool(torch.allclose(replayed.float(), eager.float(), rtol=1e-2, atol=1e-2))

    def can_run(self, inputs: ModelInputs) -> bool:
        meta = inputs.meta
        return (
            meta.max_query_len == 1
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
