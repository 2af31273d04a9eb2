"""The input batcher packs a step's chunks into tensors: checked token by token against the
definition of each field on random mixed steps."""

from __future__ import annotations

import random

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine
from hetero_infer.engine.worker.input_batch import Chunk

from tests.tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    folder = save_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    config = EngineConfig(model=str(folder), max_model_len=512, max_num_blocks=256, block_size=8)
    return LLMEngine(config).runner


@pytest.mark.parametrize("seed", range(5))
def test_inputs_match_their_definition(runner, seed):
    rng = random.Random(seed)
    bs = runner.block_size
    chunks = []
    for _ in range(rng.randint(1, 9)):
        start = rng.choice([0, rng.randint(0, 100)])
        new = rng.choice([1, rng.randint(1, 40)])
        table = rng.sample(range(256), -(-(start + new) // bs) + rng.randint(0, 2))
        ids = [rng.randrange(384) for _ in range(new)]
        samples = rng.random() < 0.7
        # A sampling chunk may end in draft tokens (speculative decoding).
        drafts = rng.choice([0, rng.randint(0, new - 1)]) if samples else 0
        chunks.append(Chunk(ids, start, [table], samples, drafts))
    if not any(c.samples for c in chunks):
        chunks[0] = chunks[0]._replace(samples=True)
    inputs = runner.inputs.build(chunks)
    meta = inputs.meta
    ids, positions, slots, logits_rows = [], [], [], []
    for new_ids, start, (table,), samples, drafts, *_ in chunks:
        ids += new_ids
        positions += range(start, start + len(new_ids))
        slots += [table[p // bs] * bs + p % bs for p in range(start, start + len(new_ids))]
        if samples:  # the last token's logits, and each draft token's
            logits_rows += range(len(ids) - 1 - drafts, len(ids))
    assert inputs.input_ids.tolist() == ids
    assert inputs.positions.tolist() == positions
    assert meta.slot_mapping.tolist() == slots
    assert inputs.logits_indices.tolist() == logits_rows
    assert meta.context_lens.tolist() == [start + len(i) for i, start, *_ in chunks]
    assert meta.max_query_len == max(len(c[0]) for c in chunks)
    lens = [0] + [len(c[0]) for c in chunks]
    assert meta.query_start_loc.tolist() == [sum(lens[: i + 1]) for i in range(len(lens))]
    max_blocks = -(-meta.max_context_len // bs)
    for row, (_, _, (table,), *_) in zip(meta.block_tables.tolist(), chunks, strict=True):
        used = table[:max_blocks]
        assert row == used + [0] * (max_blocks - len(used))
