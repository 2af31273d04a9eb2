"""ModelRunner: owns the model and the KV cache; runs one scheduled step.

Built as nano-vllm builds its runner: load the model, size and allocate the KV cache
(kv_sizing.py, kv_cache.py), set up its fast path (fast_path.py). A step is block
copies, one forward pass, prompt logprobs, embeddings, logits and sampling (at drafted
positions too); it reads only the scheduler's plain output and returns a plain
ModelRunnerOutput, so it never changes a request (and may run in any thread). With
tensor parallelism rank 0 sends each step's inputs, and the hidden states it wants
logits for, to the other ranks (engine/distributed/step_broadcast.py).
"""

from __future__ import annotations

import logging
import time

import torch
from hetero_infer.engine.core.step_data import (
    EMPTY_RUNNER_OUTPUT,
    PENDING_TOKEN,
    ModelRunnerOutput,
    ScheduledSequence,
    SchedulerOutput,
)
from hetero_infer.engine.distributed.process_group import TensorParallelGroup
from hetero_infer.engine.distributed.step_broadcast import StepSender
from hetero_infer.engine.kv.tier_store import build_tier_store
from hetero_infer.engine.lora import ModelLoRA
from hetero_infer.engine.models.protocol import ImageEmbeds
from hetero_infer.engine.setup import EngineSetup
from hetero_infer.engine.worker.cuda_graphs import DecodeGraphs
from hetero_infer.engine.worker.draft_runner import DraftRunner
from hetero_infer.engine.worker.draft_source import DraftSource
from hetero_infer.engine.worker.fast_path import FastPath, decoder_stack_path
from hetero_infer.engine.worker.image_embeddings import ImageEmbeddings
from hetero_infer.engine.worker.input_batch import Chunk, InputBatcher, ModelInputs
from hetero_infer.engine.worker.kv_cache import ModelKVCache, bytes_per_block
from hetero_infer.engine.worker.kv_sizing import kv_cache_budget, pool_sizes, profile_step_memory
from hetero_infer.engine.worker.model_loader import load_model, select_model_kernels
from hetero_infer.engine.worker.pooler import Pooler
from hetero_infer.engine.worker.prompt_logprobs import prompt_logprobs
from hetero_infer.engine.worker.step_sampling import StepSampling
from hetero_infer.kernels import AttentionInputs, Kernels, stored_head_size

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(
        self,
        setup: EngineSetup,
        tp: TensorParallelGroup | None = None,
        draft: DraftSource | None = None,
    ) -> None:
        """``tp``: this rank's tensor-parallel group (None: the whole model here).
        ``draft``: speculative decoding's draft model, whose KV cache is allocated
        beside the target's (worker/draft_runner.py; on rank 0 only, whole)."""
        self.config = config = setup.config
        self.device, self.dtype = setup.device, setup.dtype
        self.kernels = kernels = select_model_kernels(config, self.device)
        source, quantization = (setup.source, setup.model_config), config.quantization
        self.model = load_model(*source, kernels, self.device, self.dtype, quantization, tp)
        # Each sequence's latest sampled token, the input of its next step where async
        # scheduling handed that step over before this one's tokens were known.
        self.last_sampled: dict[str, int] = {}
        # LoRA adapters' slots beside the model's projections (engine/lora/), if enabled
        self.lora = ModelLoRA(self.model, kernels.ops) if config.enable_lora else None
        # Rank 0 of a tensor-parallel group tells the other ranks what to compute.
        self.sender = StepSender(tp) if tp is not None and tp.rank == 0 else None
        self.attention = kernels.attention
        self.max_model_len = setup.max_model_len
        # LongRoPE's long factors' rows in the RoPE tables: after the short ones'.
        self.long_rope_rows = setup.model_config.max_position_embeddings
        self.block_size = config.block_size
        # Which layers share a KV cache group, and what each group keeps.
        self.kv_layout = setup.model_config.kv_layout
        self.inputs = InputBatcher(
            config.block_size,
            self.device,
            self.attention,
            self.model.sliding_windows,
            self.kv_layout.num_groups,
        )
        self.sampling = StepSampling(kernels.ops, config.seed, self.device)
        self.image_embeddings = ImageEmbeddings(self.model, self.device)
        self.pooler = Pooler()
        # How the cache stores keys and values: the model's dtype, or int8 rows that
        # carry their scale (kernels/kv_quant.py), or fp8.
        self.kv_dtype = setup.kv_cache_dtype
        # (block_size, num_kv_heads, elements a token's head takes: head_dim (+ scale))
        self.block_shape = (
            config.block_size,
            self.model.num_kv_heads,
            stored_head_size(self.model.head_dim, self.kv_dtype),
        )
        group_block_bytes = [
            bytes_per_block(n, self.block_shape, self.kv_dtype)
            for n in map(self.kv_layout.num_layers_in, range(self.kv_layout.num_groups))
        ]
        self.drafter: DraftRunner | None = None
        if draft is not None:
            self.drafter = DraftRunner(draft, kernels, self.device, self.dtype, config.block_size)
            # A block id holds the target's and the draft's KV of the same tokens.
            group_block_bytes[0] += self.drafter.bytes_per_block
        self.bytes_per_block = group_block_bytes[0]
        # The blocks of each group; the first group's are what the scheduler counts.
        self.group_blocks = pool_sizes(
            config,
            lambda: kv_cache_budget(config, self.device, self._profile_step_memory),
            group_block_bytes,
            self.kv_layout.group_windows,
        )
        if tp is not None:
            # One block table addresses every rank's cache: all hold the same blocks.
            self.group_blocks = [tp.all_reduce_min(n) for n in self.group_blocks]
        self.num_blocks = self.group_blocks[0]
        self.kv_cache = ModelKVCache(
            self.kv_layout,
            self.group_blocks,
            config.num_cpu_blocks,
            self.block_shape,
            self.kv_dtype,
            self.device,
        )
        if config.kv_cache_prefault:
            started = time.perf_counter()
            self.kv_cache.prefault()
            logger.info("KV cache written once in %.2f s", time.perf_counter() - started)
        self.kv_caches = self.kv_cache.layers
        self.kv_cache.tiers = build_tier_store(
            setup, self.kv_cache.group_layers, self.block_shape, self.device
        )
        if self.drafter is not None:
            self.drafter.allocate(self.num_blocks, config.num_cpu_blocks)
        # The one fast path (worker/fast_path.py), where there is one. Not with tensor
        # parallelism: ranks would replay graphs in step; the stack has no all-reduce.
        self.fast_path = self._fast_path(kernels) if tp is None else None

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run a scheduled step: block copies, one forward pass, prompt logprobs,
        embeddings and sampling."""
        self.pooler.forget(out.finished)
        for request_id in out.finished:
            self.last_sampled.pop(request_id, None)
        # Copies first: the draft writes its KV into the blocks they give. A step with
        # nothing to compute may still read the disk tier for a waiting sequence.
        reads = self.kv_cache.copy_blocks(out)
        if out.is_empty:
            return ModelRunnerOutput(tier_reads=reads) if reads else EMPTY_RUNNER_OUTPUT
        scheduled = out.scheduled
        draft_probs: dict[str, torch.Tensor] = {}
        if self.drafter is not None:
            scheduled, draft_probs = self.drafter.propose(
                out, self.sampling.sampler, self.sampling.randomness
            )
        inputs = self.inputs.build(
            [
                Chunk(
                    self._with_pending_token(s),
                    s.start,
                    s.block_tables,
                    s.samples,
                    s.num_draft_tokens,
                    self.long_rope_rows if s.long_rope else 0,
                    s.lora_slot,
                    s.images,
                )
                for s in scheduled
            ]
        )
        if inputs.image_placements:
            inputs.image_embeds = self.image_embeddings(inputs.image_placements)
        if self.sender is not None:
            self.sender.send_step(
                out, inputs.input_ids, inputs.positions, inputs.meta, inputs.image_embeds
            )
        hidden = self.forward(inputs)
        prompt = prompt_logprobs(self.compute_logits, scheduled, hidden)
        embeddings = self.pooler(scheduled, hidden)
        sampling = [s for s in scheduled if s.samples]
        if not sampling:
            return ModelRunnerOutput({}, prompt, embeddings, reads)
        logits = self.compute_logits(hidden[inputs.logits_indices])  # [rows, vocab]
        sampled = self.sampling(sampling, logits, draft_probs)
        self.last_sampled.update((rid, tokens[-1].token_id) for rid, tokens in sampled.items())
        return ModelRunnerOutput(sampled, prompt, embeddings, reads)

    def _with_pending_token(self, s: ScheduledSequence) -> list[int]:
        """Its tokens, the one pending (async scheduling, core/pending_tokens.py) being
        what the step before sampled for it."""
        if s.token_ids[-1] != PENDING_TOKEN:
            return s.token_ids
        return [*s.token_ids[:-1], self.last_sampled[s.request_id]]

    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        """The model's final hidden states for a step's inputs: through the fast path
        where it can run the step, else the layers one by one."""
        if self.lora is not None:
            self.lora.use(inputs.lora_groups)
        fast = self.fast_path is not None and inputs.image_embeds is None
        if fast and self.fast_path.can_run(inputs):
            return self.fast_path.run(inputs)
        return self.model(
            inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, inputs.image_embeds
        )

    def _fast_path(self, kernels: Kernels) -> FastPath | None:
        """CUDA graphs on CUDA (with a backend whose metadata they can hold, unless
        enforce_eager); on the CPU the kernels' one-call decoder stack, where they
        have one for this model's weights."""
        if self.device.type == "cuda":
            if self.config.enforce_eager or not self.attention.supports_cuda_graphs:
                return None
            if self.kv_layout.num_groups > 1 or self.model.config.moe is not None:
                # The graphs' static buffers hold one group's block tables; experts'
                # work is sized on the host per step (kernels/moe_triton.py).
                logger.info("CUDA graphs off: more than one KV cache group, or routed experts")
                return None
            return DecodeGraphs.capture(self)
        return decoder_stack_path(self.model, kernels, self.kv_caches, self.lora)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden] -> logits [n, vocab], the other ranks computing their
        share where there are any."""
        if self.sender is not None:
            self.sender.send_logits(hidden)
        return self.model.compute_logits(hidden)

    # ---- a tensor-parallel rank other than 0, on rank 0's commands ----

    @torch.inference_mode()
    def execute_share(
        self,
        copies: SchedulerOutput,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention_inputs: AttentionInputs,
        image_embeds: ImageEmbeds | None = None,
    ) -> None:
        """This rank's share of a step rank 0 sent (executor/rank_worker.py): the block
        copies and the forward pass over its heads, whose hidden states equal rank 0's
        after each all-reduce (rank 0 sends the rows it wants logits for, and the images'
        embeddings its vision tower made)."""
        self.kv_cache.copy_blocks(copies)
        meta = self.inputs.prepare(attention_inputs)
        self.model(input_ids, positions, self.kv_caches, meta, image_embeds)

    @torch.inference_mode()
    def compute_logits_share(self, hidden: torch.Tensor) -> None:
        """This rank's vocabulary share of the logits rank 0 gathers (and reads)."""
        self.model.compute_logits(hidden)

    def _profile_step_memory(self) -> int:
        return profile_step_memory(
            self.model,
            self.inputs,
            self.config,
            self.max_model_len,
            self.block_shape,
            self.kv_dtype,
        )

    def stop_workers(self) -> None:
        """Tell the other ranks to leave their loops (rank 0; once)."""
        sender, self.sender = self.sender, None
        if sender is None:
            return
        try:
            sender.send_stop()
        except RuntimeError as exc:  # a rank that is gone already
            logger.warning("could not tell the other ranks to stop: %s", exc)
