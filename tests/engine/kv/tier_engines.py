"""Engines over tiny random models with a KV pool small enough that blocks are evicted
and come back from the prefix cache's tiers; shared by the tier tests."""

from __future__ import annotations

import random
from pathlib import Path

from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.tiny_models import TINY_MODELS, save_tiny_model

BLOCK_SIZE = 4
NUM_BLOCKS = 48  # 192 tokens: three 60-token prompts and their answers evict the first
MAX_MODEL_LEN = 160
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def bytes_per_slot(model: str) -> int:
    """A host slot's bytes (every group's block) in fp32: 2 * layers * 4 * heads * dim * 4."""
    layers_heads_dim = {"llama": (3, 1, 24), "gemma3": (4, 2, 16)}[model]
    layers, heads, dim = layers_heads_dim
    return 2 * layers * BLOCK_SIZE * heads * dim * 4


def tier_config(
    folder: Path, model: str, ram_slots: int = 0, disk: Path | None = None, **extra
) -> EngineConfig:
    values = dict(
        model=str(folder),
        dtype="float32",
        block_size=BLOCK_SIZE,
        max_num_blocks=NUM_BLOCKS,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=1,  # one at a time: every run computes alike
    )
    if ram_slots:
        values["kv_offloading_size"] = ram_slots * bytes_per_slot(model) / 2**30
    if disk is not None:
        values["kv_offloading_dir"] = str(disk)
    values.update(extra)
    return EngineConfig(**values)


def prompts(vocab: int, count: int = 4, length: int = 60, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(count)]


def tiny_llama_run(
    tmp_path_factory, count: int, seed: int
) -> tuple[Path, list[list[int]], list[list[int]]]:
    """A tiny Llama's folder, ``count`` prompts and its outputs without tiers."""
    folder = save_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    batch = prompts(TINY_MODELS["llama"]().vocab_size, count=count, seed=seed)
    return folder, batch, run_in_turn(LLMEngine(tier_config(folder, "llama")), batch)


def block_files(directory: Path) -> list[Path]:
    """The disk tier's entries under ``directory`` (not its temporary files)."""
    return sorted(directory.rglob("*.kv"))


def run_in_turn(engine: LLMEngine, batch: list[list[int]]) -> list[list[int]]:
    """Each prompt alone, in order: the later ones evict the earlier ones' blocks. The
    disk tier's files are written (off the step) before the next prompt starts, so
    what the next finds on disk does not depend on the writer's pace."""
    outputs = []
    for prompt in batch:
        outputs.append(engine.generate([prompt], GREEDY, use_tqdm=False)[0].token_ids)
        written(engine)
    return outputs


def written(engine: LLMEngine) -> None:
    """Wait for the disk tier's queued writes, if it has any."""
    tiers = engine.runner.kv_cache.tiers
    if tiers is not None and tiers.writer is not None:
        assert tiers.writer.drain(timeout=60)


def assert_nothing_leaked(engine: LLMEngine) -> None:
    stats = engine.memory_stats()
    assert stats["used_blocks"] == 0
    assert stats.get("group1_used_blocks", 0) == 0
    tiers = engine.block_manager.tiers
    if tiers is not None:
        assert all(not index.pending and not index.busy for index in tiers.indexes)
