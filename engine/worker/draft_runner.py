"""DraftRunner: the draft model of speculative decoding, its KV cache and its proposals.

Design: the draft model's KV cache is a second set of tensors with the target's
number of blocks and block size, addressed by the same block tables and slot mapping
(one block id names the target's KV and the draft's KV of the same tokens). So the
scheduler's one block manager covers both: allocation, copy-on-write, swap, freeing and
the prefix cache move both models' KV at once, and the draft cache costs no bookkeeping
of its own. The price is a block budget shared by both caches (the runner sizes it by
their summed bytes per block).

Each step, before the target's pass, for the sequences the scheduler marked (see
ScheduledSequence.draft_lag_token_ids): one batched pass computes the draft's KV for
prompt chunks (it prefills alongside the target) and, for decoding sequences that
draft, for the tokens it lags by and the newest token, whose logits propose the first
draft; then one single-token pass per further draft position, batched over the
sequences still drafting. Greedy requests propose the draft's argmax; sampling ones draw
from the draft's distribution q (the target's sampling settings applied to the draft's
logits), and q is kept for rejection sampling (rejection.py). CUDA graphs are not used
for the draft's passes.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from hetero_infer.engine.core.step_data import ScheduledSequence, SchedulerOutput
from hetero_infer.engine.worker.draft_source import DraftSource
from hetero_infer.engine.worker.fast_path import DecoderStackPath, decoder_stack_path
from hetero_infer.engine.worker.input_batch import Chunk, InputBatcher
from hetero_infer.engine.worker.kv_cache import KVCache, bytes_per_block
from hetero_infer.engine.worker.model_loader import load_model
from hetero_infer.engine.worker.randomness import DRAFT_STREAM, Randomness
from hetero_infer.engine.worker.sampler import Sampler
from hetero_infer.engine.worker.sampling_metadata import SamplingMetadata
from hetero_infer.engine.worker.verifier import drafted_row
from hetero_infer.kernels import Kernels, draw_ref, process_logits_ref

logger = logging.getLogger(__name__)


class DraftRunner:
    def __init__(
        self,
        draft: DraftSource,
        kernels: Kernels,
        device: torch.device,
        dtype: torch.dtype,
        block_size: int,
    ) -> None:
        self.model = load_model(
            draft.source, draft.model_config, kernels, device, dtype, draft.quantization
        )
        self.device = device
        self.dtype = dtype
        self.kernels = kernels
        self.inputs = InputBatcher(
            block_size, device, kernels.attention, self.model.sliding_windows
        )
        # (block_size, num_kv_heads, head_dim)
        self.block_shape = (block_size, self.model.num_kv_heads, self.model.head_dim)
        self.bytes_per_block = bytes_per_block(self.model.num_layers, self.block_shape, dtype)
        self.kv_cache: KVCache | None = None
        # The kernels' one-call decoder stack on the CPU (no CUDA graphs for the draft).
        self.fast_path: DecoderStackPath | None = None

    def allocate(self, num_blocks: int, num_cpu_blocks: int) -> None:
        """The draft's KV cache: as many blocks as the target's, so its block ids apply."""
        self.kv_cache = KVCache(
            self.model.num_layers,
            num_blocks,
            num_cpu_blocks,
            self.block_shape,
            self.dtype,
            self.device,
        )
        if self.device.type == "cpu":
            self.fast_path = decoder_stack_path(self.model, self.kernels, self.kv_cache.layers)

    @torch.inference_mode()
    def propose(
        self, out: SchedulerOutput, sampler: Sampler, randomness: Randomness
    ) -> tuple[list[ScheduledSequence], dict[str, torch.Tensor]]:
        """Run the draft model for the step: the scheduled sequences with their draft
        tokens filled in, and for the sampling ones among them the draft's probabilities
        q [num_drafts, vocab] by request id."""
        assert self.kv_cache is not None
        self.kv_cache.copy_blocks(out.group_moves(0))  # the same copies as the target's
        joined = [s for s in out.scheduled if s.draft_lag_token_ids is not None]
        if not joined:
            return out.scheduled, {}
        chunks = []
        for s in joined:
            lag = list(s.draft_lag_token_ids or ())
            own = s.token_ids[: s.num_new_tokens - s.num_draft_tokens]
            chunks.append(
                Chunk(lag + own, s.start - len(lag), [s.block_table], s.num_draft_tokens > 0)
            )
        active = [s for s in joined if s.num_draft_tokens]
        proposed: dict[str, list[int]] = {s.request_id: [] for s in active}
        probs: dict[str, list[torch.Tensor]] = {
            s.request_id: [] for s in active if not s.sampling_params.greedy
        }
        while True:
            inputs = self.inputs.build(chunks)
            if self.fast_path is not None and self.fast_path.can_run(inputs):
                hidden = self.fast_path.run(inputs)
            else:
                hidden = self.model(
                    inputs.input_ids, inputs.positions, self.kv_cache.layers, inputs.meta
                )
            if not active:
                break  # prompt chunks only: their KV was all that was needed
            logits = self.model.compute_logits(hidden[inputs.logits_indices])  # [rows, vocab]
            rows = [drafted_row(s, proposed[s.request_id]) for s in active]
            for s, token in zip(
                active, self._pick(logits, rows, sampler, randomness, probs), strict=True
            ):
                proposed[s.request_id].append(token)
            active = [s for s in active if len(proposed[s.request_id]) < s.num_draft_tokens]
            if not active:
                break
            # The newest draft, at the position after the tokens before it (the step's
            # own token is its sequence's newest: a drafting step computes one).
            chunks = [
                Chunk(
                    [proposed[s.request_id][-1]],
                    s.start + len(proposed[s.request_id]),
                    [s.block_table],
                    True,
                )
                for s in active
            ]
        filled = [
            s
            if s.request_id not in proposed
            else dataclasses.replace(
                s,
                token_ids=s.token_ids[: s.num_new_tokens - s.num_draft_tokens]
                + proposed[s.request_id],
                draft_token_ids=tuple(proposed[s.request_id]),
            )
            for s in out.scheduled
        ]
        return filled, {request_id: torch.stack(q) for request_id, q in probs.items()}

    def _pick(
        self,
        logits: torch.Tensor,
        rows: list[ScheduledSequence],
        sampler: Sampler,
        randomness: Randomness,
        probs: dict[str, list[torch.Tensor]],
    ) -> list[int]:
        """One draft token per row: the argmax of the draft's (processed) logits for
        greedy rows; for sampling rows a draw from q, which is kept in ``probs``."""
        vocab = logits.shape[-1]
        greedy = [i for i, r in enumerate(rows) if r.sampling_params.greedy]
        tokens = [0] * len(rows)
        if greedy:
            picked = [rows[i] for i in greedy]
            meta = SamplingMetadata.build(picked, vocab, self.device, None)
            chosen = logits[greedy]
            if meta.tensors is not None:
                chosen = process_logits_ref(chosen, meta.tensors)
            for i, token in zip(greedy, chosen.argmax(dim=-1).tolist(), strict=True):
                tokens[i] = token
        sampling = [i for i, r in enumerate(rows) if not r.sampling_params.greedy]
        if sampling:
            picked = [rows[i] for i in sampling]
            meta = SamplingMetadata.build(picked, vocab, self.device, randomness, DRAFT_STREAM)
            q = sampler.probabilities(logits[sampling], meta)  # [rows, vocab]
            assert meta.tensors is not None
            draws = draw_ref(q, meta.tensors.uniforms).tolist()
            for n, i in enumerate(sampling):
                tokens[i] = draws[n]
                probs[rows[i].request_id].append(q[n])
        return tokens
