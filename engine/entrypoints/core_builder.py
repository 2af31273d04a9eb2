"""The engine's parts below its front end, built from a resolved setup: the other
tensor-parallel ranks (where there are any), the model runner (with its draft model),
and over the runner's KV blocks the block manager, scheduler and speculator that make
up the EngineCore.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hetero_infer.engine.core.block_hashing import BlockHasher, block_hasher
from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.engine_core import EngineCore
from hetero_infer.engine.core.kv_events import KVEventLog
from hetero_infer.engine.core.scheduler import Scheduler
from hetero_infer.engine.core.speculator import NOT_SPECULATED, Speculator
from hetero_infer.engine.entrypoints.metrics import EngineMetrics
from hetero_infer.engine.executor.launcher import LocalWorkers, start_tensor_parallel
from hetero_infer.engine.kv.disk_layout import load_or_create_key
from hetero_infer.engine.kv.tier_planner import TierPlanner
from hetero_infer.engine.lora import LoRAManager
from hetero_infer.engine.models.sharding import check_divisible
from hetero_infer.engine.settings.exceptions import OutOfMemoryError
from hetero_infer.engine.setup import EngineSetup
from hetero_infer.engine.worker.draft_source import resolve_draft
from hetero_infer.engine.worker.model_runner import ModelRunner

if TYPE_CHECKING:
    from hetero_infer.engine.entrypoints.kv_event_publisher import ZmqEventPublisher

logger = logging.getLogger(__name__)


@dataclass
class BuiltCore:
    core: EngineCore
    runner: ModelRunner
    # The other tensor-parallel ranks this process started (None in one process, or
    # when torchrun started them).
    workers: LocalWorkers | None
    metrics: EngineMetrics
    lora: LoRAManager | None = None  # the LoRA adapters, where enabled
    kv_events: ZmqEventPublisher | None = None  # where the prefix cache's events go


def build_core(setup: EngineSetup, tokenizer: Any) -> BuiltCore:
    """Start the ranks, load the model(s) and size the KV cache, then build the core
    over it. ``tokenizer``: the target's, which a draft model's must match."""
    config = setup.config
    draft = None
    spec = setup.speculative
    if spec is not None and spec.uses_draft_model:
        # Checked before either model's weights are read.
        draft = resolve_draft(
            spec, setup.source, setup.model_config, setup.max_model_len, tokenizer
        )
    # With tensor parallelism, the other ranks (started here, or by torchrun) load their
    # shares of the model beside this one's.
    workers = tp = None
    if config.tensor_parallel_size > 1:
        check_divisible(setup.model_config, config.tensor_parallel_size)
        tp, workers = start_tensor_parallel(setup)
    try:
        runner = ModelRunner(setup, tp, draft)
        check_kv_capacity(runner, setup)
    except BaseException:
        if workers is not None:
            workers.stop(timeout=0)
        raise
    tiers, hash_key = tier_planner(runner)
    publisher = events = None
    if config.kv_events_config is not None:  # ZeroMQ and msgspec loaded only for them
        from hetero_infer.engine.entrypoints.kv_event_publisher import event_publisher

        publisher = event_publisher(config.kv_events_config)
    if publisher is not None:
        events = KVEventLog(publisher.publish, config.block_size)
    # Each KV cache group's retention and blocks: the first's are runner.num_blocks.
    groups = list(zip(runner.kv_layout.group_windows, runner.group_blocks, strict=True))
    block_manager = BlockManager(
        runner.num_blocks,
        config.block_size,
        num_cpu_blocks=config.num_cpu_blocks,
        enable_prefix_caching=config.enable_prefix_caching,
        later_groups=groups[1:],
        tiers=tiers,
        hasher=prefix_hasher(config.prefix_caching_hash_algo, hash_key),
        events=events,
    )
    speculator = None
    if spec is not None:
        logger.info("%s; not speculated: %s", spec.describe(), NOT_SPECULATED)
        speculator = Speculator(spec)
    scheduler = Scheduler(
        block_manager,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=setup.max_model_len,
        memory_threshold=config.memory_threshold,
        use_swap=config.use_swap,
        policy=config.scheduling_policy,
        speculator=speculator,
        long_rope_after=runner.model.long_rope_after,
    )
    metrics = EngineMetrics()
    if speculator is not None:
        # The speculator counts the drafts it hears back about (vllm:spec_decode_*).
        metrics.spec_decode = speculator.stats
    # Async scheduling only where asked for (as vLLM's): on an H200 it did not pay yet,
    # the runner's thread and the engine's contending for the GIL (docs/gpu.md); on a
    # CPU the cores compute the step themselves.
    async_scheduling = bool(config.async_scheduling)
    core = EngineCore(scheduler, runner, metrics, config.max_queue_time, async_scheduling)
    lora = None
    if runner.lora is not None:
        lora = LoRAManager(
            runner.lora,
            setup.model_config,
            config.max_loras,
            config.max_lora_rank,
            setup.device,
            setup.dtype,
        )
    return BuiltCore(core, runner, workers, metrics, lora, publisher)


def tier_planner(runner: ModelRunner) -> tuple[TierPlanner | None, bytes | None]:
    """The scheduler's side of the runner's KV tiers, and the block hashes' key: the
    one the disk tier's directory keeps for every replica that shares it."""
    store = runner.kv_cache.tiers
    if store is None:
        return None, None
    layout = store.layout
    planner = TierPlanner(
        len(store.hosts), store.num_slots, runner.block_size, layout, store.disk_changes
    )
    return planner, None if layout is None else load_or_create_key(layout.root)


def prefix_hasher(algo: str, key: bytes | None) -> BlockHasher:
    """The block hasher ``algo`` names. vLLM's sha256_cbor starts its chains from
    PYTHONHASHSEED, as vLLM reads it: unset, they start from a random seed, and no
    router can compute them (a restart's disk tier finds none of its blocks either)."""
    seed = os.environ.get("PYTHONHASHSEED")
    if algo == "sha256_cbor" and seed is None:
        logger.warning(
            "prefix_caching_hash_algo sha256_cbor without PYTHONHASHSEED: the block hashes "
            "start from a random seed, which no router can reproduce; set PYTHONHASHSEED"
        )
    return block_hasher(algo, key, seed)


def check_kv_capacity(runner: ModelRunner, setup: EngineSetup) -> None:
    """Refuse a KV cache that cannot hold one sequence of max_model_len; log its size."""
    block_size, max_model_len = setup.config.block_size, setup.max_model_len
    capacity = runner.num_blocks * block_size
    if capacity < max_model_len:
        raise OutOfMemoryError(
            f"max_num_blocks: the KV cache holds {capacity} tokens "
            f"({runner.num_blocks} blocks of {block_size}), fewer than "
            f"max_model_len ({max_model_len}); add blocks or lower max_model_len"
        )
    logger.info(
        "KV cache: %d blocks of %d tokens (%.1f MiB), max concurrency %.1f at %d tokens",
        runner.num_blocks,
        block_size,
        runner.num_blocks * runner.bytes_per_block / 2**20,
        capacity / max_model_len,
        max_model_len,
    )
