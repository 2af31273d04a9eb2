"""Async scheduling (EngineCore with async_scheduling): the next step is scheduled and
handed over before the one in flight is applied, and the tokens come out as they do
with steps one at a time.

The fake runner here is a model without weights that behaves as the real one must: it
runs on the core's runner thread, reads nothing but the steps it is given, keeps "KV"
in every block slot (a hash of the tokens up to a position), checks that the context
each step attends to holds the KV of that sequence's tokens, and picks the next token
from the KV at the sampled position. A pending token is replaced by what it sampled
for the sequence last. Reading a stale, stolen or half-written block, or a wrong
input token, changes the tokens or fails the check.
"""

from __future__ import annotations

import collections
import random

import pytest
from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.engine_core import CoreCounters, EngineCore
from hetero_infer.engine.core.scheduler import Scheduler
from hetero_infer.engine.core.sequence import Sequence, SequenceStatus
from hetero_infer.engine.core.step_data import (
    PENDING_TOKEN,
    ModelRunnerOutput,
    SampledToken,
    SchedulerOutput,
)
from hetero_infer.engine.params.sampling_params import SamplingParams

VOCAB = 6
EOS = 5
BLOCK_SIZE = 4


class KVModel:
    """A fake model runner with a paged "KV" cache (GPU and CPU blocks)."""

    def __init__(self, num_blocks: int, num_cpu_blocks: int, prompts: dict[str, list[int]]):
        self.gpu = [[None] * BLOCK_SIZE for _ in range(num_blocks)]
        self.cpu = [[None] * BLOCK_SIZE for _ in range(num_cpu_blocks)]
        # Each sequence's tokens as this runner learns them (a prompt, then what it
        # sampled or was given), to know what KV a position must hold.
        self.tokens = {rid: list(prompt) for rid, prompt in prompts.items()}
        self.last_sampled: dict[str, int] = {}
        self.pending_seen = 0
        self.num_sampled: collections.Counter[str] = collections.Counter()

    def kv(self, request_id: str, pos: int) -> int:
        return hash(tuple(self.tokens[request_id][: pos + 1]))

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for gpu, cpu in out.blocks_to_swap_out:
            self.cpu[cpu] = list(self.gpu[gpu])
        for cpu, gpu in out.blocks_to_swap_in:
            self.gpu[gpu] = list(self.cpu[cpu])
        for src, dst in out.blocks_to_copy:
            self.gpu[dst] = list(self.gpu[src])
        sampled = {}
        for item in out.scheduled:
            rid, table = item.request_id, item.block_table
            tokens = list(item.token_ids)
            if tokens[-1] == PENDING_TOKEN:
                tokens[-1] = self.last_sampled[rid]
                self.pending_seen += 1
            known = self.tokens[rid]
            # What it is given agrees with what it knows, and may extend it.
            end = item.start + len(tokens)
            overlap = min(end, len(known)) - item.start
            assert overlap >= 0 and known[item.start : item.start + overlap] == tokens[:overlap]
            known[item.start : end] = tokens
            for pos in range(item.start):
                slot = self.gpu[table[pos // BLOCK_SIZE]][pos % BLOCK_SIZE]
                assert slot == self.kv(rid, pos), (rid, pos)
            for pos in range(item.start, end):
                self.gpu[table[pos // BLOCK_SIZE]][pos % BLOCK_SIZE] = self.kv(rid, pos)
            if item.samples:
                token = self.kv(rid, end - 1) % VOCAB
                if token in item.banned_token_ids:
                    token = (token + 1) % (VOCAB - 1)
                self.last_sampled[rid] = token
                self.num_sampled[rid] += 1
                known.append(token)
                sampled[rid] = [SampledToken(token, 0.0)]
        return ModelRunnerOutput(sampled)


def workload(seed: int) -> list[tuple[str, list[int], SamplingParams]]:
    rng = random.Random(seed)
    shared = [rng.randrange(VOCAB - 1) for _ in range(9)]
    requests = []
    for i in range(12):
        prompt = shared[: rng.randrange(10)] + [rng.randrange(VOCAB - 1) for _ in range(5)]
        params = SamplingParams(
            max_tokens=rng.randrange(3, 14),
            ignore_eos=rng.random() < 0.5,
            min_tokens=rng.choice([0, 0, 3]),
            stop_token_ids=rng.choice([[], [4]]),
            n=rng.choice([1, 1, 2]),
        )
        requests.append((f"r{i}", prompt, params))
    return requests


def run(seed: int, async_scheduling: bool, num_blocks: int, num_cpu_blocks: int, aborts: bool):
    """Every request's tokens and finish reason, with requests arriving while others
    run and (``aborts``) some aborted along the way."""
    requests = workload(seed)
    choices = {
        f"{rid}#{i}" if i else rid: prompt
        for rid, prompt, params in requests
        for i in range(params.n)
    }
    model = KVModel(num_blocks, num_cpu_blocks, choices)
    bm = BlockManager(num_blocks, BLOCK_SIZE, num_cpu_blocks, enable_prefix_caching=True)
    scheduler = Scheduler(
        bm,
        max_num_seqs=4,
        max_num_batched_tokens=7,
        max_model_len=num_blocks * BLOCK_SIZE,
        use_swap=num_cpu_blocks > 0,
    )
    core = EngineCore(scheduler, model, CoreCounters(), async_scheduling=async_scheduling)
    results: dict[str, tuple[list[int], str | None]] = {}
    rng = random.Random(seed)
    step = 0
    while requests or core.has_unfinished():
        if requests and step % 3 == 0:
            rid, prompt, params = requests.pop(0)
            ids = [seq_id for seq_id in choices if seq_id.split("#")[0] == rid]
            seqs = [Sequence(seq_id, prompt, params, frozenset({EOS})) for seq_id in ids]
            core.add(seqs, None)
        for update in core.step():
            tokens, _ = results.get(update.request_id, ([], None))
            tokens = tokens + [t.token_id for t in update.new_tokens]
            results[update.request_id] = (tokens, update.finish_reason)
            assert update.num_output_tokens == len(tokens)
        if aborts and rng.random() < 0.05 and scheduler.queues.running:
            victim = rng.choice(scheduler.queues.running).request_id
            core.finish([victim], SequenceStatus.FINISHED_ABORTED)
            results[victim] = (results.get(victim, ([], None))[0], "abort")
        step += 1
    assert bm.num_used_blocks == 0 and sorted(bm.free_cpu_blocks) == list(range(num_cpu_blocks))
    for rid, (tokens, reason) in results.items():
        if reason == "length":  # no step after its last token, even one handed over early
            assert model.num_sampled[rid] == len(tokens), rid
    return results, core.counters, model.pending_seen


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "num_blocks, num_cpu_blocks",
    [(64, 0), (7, 0), (7, 16)],
    ids=["roomy", "recompute", "swap"],
)
def test_async_steps_give_the_tokens_of_steps_one_at_a_time(seed, num_blocks, num_cpu_blocks):
    expected, _, _ = run(seed, False, num_blocks, num_cpu_blocks, aborts=False)
    actual, counters, pending_seen = run(seed, True, num_blocks, num_cpu_blocks, aborts=False)
    assert actual == expected
    assert pending_seen > 0  # steps were handed over before the one before was applied
    if num_blocks == 7:
        assert counters.num_preemptions > 0


@pytest.mark.parametrize("seed", range(6))
def test_aborts_while_a_step_is_in_flight_lose_nothing(seed):
    """Aborted sequences' blocks go back while the runner may still write them; the
    model's checks and the block counts at the end show nothing read them stale."""
    results, _, _ = run(seed, True, 7, 16, aborts=True)
    assert any(reason == "abort" for _, reason in results.values()) or seed
