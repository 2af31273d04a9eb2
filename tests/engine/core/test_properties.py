"""Property tests: hypothesis drives a BlockManager + Scheduler through random
add / step / abort / fork sequences on a tiny KV cache, so prefix hits, chunked
prefill, copy-on-write and preemption (recompute and swap) all happen, under both
scheduling policies, and with speculative decoding (n-gram drafts, or a draft model's,
of which the fake model accepts a random number).

A fake model runner keeps the "KV" of every GPU and CPU block slot and applies the
scheduler's swap and copy lists the way the real runner must (swap out, swap in,
copy, then the forward pass). The KV of a position is a hash of every token up to
it, so a sequence that reads a stale, stolen or wrongly shared block is caught. With
a draft model it keeps the draft's KV beside the target's, in blocks of the same ids.
"""

from __future__ import annotations

import dataclasses

from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.scheduler import Scheduler, priority_key
from hetero_infer.engine.core.sequence import Sequence, SequenceStatus
from hetero_infer.engine.core.speculator import Speculator
from hetero_infer.engine.core.step_data import (
    DRAFT_PLACEHOLDER,
    ModelRunnerOutput,
    SampledToken,
    SchedulerOutput,
)
from hetero_infer.engine.params.sampling_params import SamplingParams
from hetero_infer.engine.settings.speculative_config import SpeculativeConfig
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

VOCAB = 4  # tiny, so that random prompts share prefixes
EOS = VOCAB - 1  # not 0: hypothesis draws small values often, and eos ends sequences
# Prompts start with a prefix of one of these, then a random suffix.
PREFIXES = [[1, 2, 3] * 16, [3, 1] * 24, [2] * 48]


class FakeRunner:
    def __init__(
        self, num_blocks: int, num_cpu_blocks: int, block_size: int, draft_model: bool = False
    ) -> None:
        self.block_size = block_size
        self.gpu: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]
        self.cpu: list[list[int | None]] = [[None] * block_size for _ in range(num_cpu_blocks)]
        # A draft model's KV: the same block ids in tensors of its own.
        self.draft_gpu: list[list[int | None]] | None = None
        self.draft_cpu: list[list[int | None]] | None = None
        if draft_model:
            self.draft_gpu = [[None] * block_size for _ in range(num_blocks)]
            self.draft_cpu = [[None] * block_size for _ in range(num_cpu_blocks)]
        self._prefix_hashes: dict[str, list[int]] = {}

    def kv(self, seq: Sequence, pos: int) -> int:
        """What the model writes at ``pos``: a function of every token up to it."""
        hashes = self._prefix_hashes.setdefault(seq.request_id, [])
        while len(hashes) <= pos:  # tokens are only ever appended
            hashes.append(hash((hashes[-1] if hashes else None, seq.token_ids[len(hashes)])))
        return hashes[pos]

    def read(self, cache: list[list[int | None]], seq: Sequence, pos: int) -> int | None:
        return cache[seq.block_table[pos // self.block_size]][pos % self.block_size]

    def execute(
        self, out: SchedulerOutput, seqs: dict[str, Sequence], bm: BlockManager
    ) -> SchedulerOutput:
        """Apply a step the way the real runner does, from the scheduler's plain data
        alone (``seqs`` only supplies the token history the fake KV hashes). Returns the
        step with a draft model's drafts filled in."""
        caches = [(self.gpu, self.cpu)]
        if self.draft_gpu is not None and self.draft_cpu is not None:
            caches.append((self.draft_gpu, self.draft_cpu))
            out = self._draft(out, seqs)
        for gpu_cache, cpu_cache in caches:
            for gpu, cpu in out.blocks_to_swap_out:
                cpu_cache[cpu] = list(gpu_cache[gpu])
            for cpu, gpu in out.blocks_to_swap_in:
                gpu_cache[gpu] = list(cpu_cache[cpu])
            for src, dst in out.blocks_to_copy:
                gpu_cache[dst] = list(gpu_cache[src])
        if self.draft_gpu is not None:
            self._draft_writes(out, seqs, bm)
        for item in out.scheduled:
            seq, bs, table = seqs[item.request_id], self.block_size, item.block_table
            own_end = item.start + item.num_new_tokens - item.num_draft_tokens
            assert item.token_ids[: own_end - item.start] == seq.token_ids[item.start : own_end]
            for pos in range(item.start):  # the context this step attends to
                assert self.gpu[table[pos // bs]][pos % bs] == self.kv(seq, pos), (seq, pos)
            # Draft tokens' KV chains on from the sequence's as a real model's would: it
            # is the sequence's own once the drafts are accepted.
            kv = self.kv(seq, item.start - 1) if item.start else None
            for pos, token in enumerate(item.token_ids, start=item.start):
                kv = hash((kv, token))
                self.gpu[table[pos // bs]][pos % bs] = kv
        return out

    @staticmethod
    def _draft(out: SchedulerOutput, seqs: dict[str, Sequence]) -> SchedulerOutput:
        """The draft model's proposals in place of the scheduler's placeholders."""
        scheduled = []
        for item in out.scheduled:
            drafts = item.draft_token_ids
            if drafts:
                assert set(drafts) == {DRAFT_PLACEHOLDER}
                assert item.draft_lag_token_ids is not None  # the draft runs where it drafts
                proposed = tuple(1 + (item.start + j) % (VOCAB - 1) for j in range(len(drafts)))
                own = item.token_ids[: item.num_new_tokens - len(drafts)]
                item = dataclasses.replace(
                    item, token_ids=own + list(proposed), draft_token_ids=proposed
                )
            scheduled.append(item)
        return dataclasses.replace(out, scheduled=scheduled)

    def _draft_writes(
        self, out: SchedulerOutput, seqs: dict[str, Sequence], bm: BlockManager
    ) -> None:
        """The draft model's passes: it reads its KV of everything before what it
        computes, then writes the tokens it lags by, the step's own, and every draft but
        the last. They never change draft KV that another sequence counts as computed,
        nor a block the prefix cache holds (this machine's mid-generation forks can leave
        a sequence catching up in a shared block: only where the other sharers have no
        draft KV yet, or with the KV that is there already)."""
        assert self.draft_gpu is not None
        bs = self.block_size
        for item in out.scheduled:
            lag = item.draft_lag_token_ids
            if lag is None:
                continue
            seq, table = seqs[item.request_id], item.block_table
            begin = item.start - len(lag)
            assert begin == seq.num_draft_computed_tokens
            assert list(lag) == seq.token_ids[begin : item.start]
            for pos in range(begin):
                assert self.draft_gpu[table[pos // bs]][pos % bs] == self.kv(seq, pos), (seq, pos)
            kv = self.kv(seq, begin - 1) if begin else None
            tokens = (
                list(lag)
                + item.token_ids[: len(item.token_ids) - 1 if item.num_draft_tokens else None]
            )
            for pos, token in enumerate(tokens, start=begin):
                kv = hash((kv, token))
                block_id = table[pos // bs]
                if self.draft_gpu[block_id][pos % bs] != kv:
                    assert bm.blocks[block_id].block_hash is None, (seq, pos)
                    for other in seqs.values():
                        if other is seq or other.status != SequenceStatus.RUNNING:
                            continue
                        if block_id in other.block_table:
                            other_pos = other.block_table.index(block_id) * bs + pos % bs
                            assert other_pos >= other.num_draft_computed_tokens, (seq, other)
                self.draft_gpu[block_id][pos % bs] = kv


class SchedulerMachine(RuleBasedStateMachine):
    """Random configurations: tiny caches, budgets and batch sizes, with or without swap
    space and prefix caching, and a memory_threshold that may hold admissions back."""

    @initialize(
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(2, 10),
        use_swap=st.booleans(),
        num_cpu_blocks=st.integers(0, 16),
        max_num_seqs=st.integers(1, 4),
        max_num_batched_tokens=st.integers(1, 12),
        max_model_len=st.integers(2, 40),
        memory_threshold=st.sampled_from([1.0, 0.75, 0.5]),
        enable_prefix_caching=st.booleans(),
    )
    def setup(
        self,
        block_size: int,
        num_blocks: int,
        use_swap: bool,
        num_cpu_blocks: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        memory_threshold: float,
        enable_prefix_caching: bool,
    ) -> None:
        self._build(
            block_size,
            num_blocks,
            use_swap,
            num_cpu_blocks,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            memory_threshold,
            enable_prefix_caching,
        )

    def _build(
        self,
        block_size: int,
        num_blocks: int,
        use_swap: bool,
        num_cpu_blocks: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        memory_threshold: float,
        enable_prefix_caching: bool,
        policy: str = "fcfs",
        speculator: Speculator | None = None,
    ) -> None:
        # The engine never lets one sequence outgrow the whole cache.
        self.max_model_len = min(max_model_len, num_blocks * block_size)
        if not use_swap:
            num_cpu_blocks = 0
        self.bm = BlockManager(num_blocks, block_size, num_cpu_blocks, enable_prefix_caching)
        self.sched = Scheduler(
            self.bm,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=self.max_model_len,
            memory_threshold=memory_threshold,
            use_swap=use_swap,
            policy=policy,
            speculator=speculator,
        )
        draft_model = speculator is not None and speculator.uses_draft_model
        self.runner = FakeRunner(num_blocks, num_cpu_blocks, block_size, draft_model)
        self.seqs: dict[str, Sequence] = {}
        self.next_id = 0
        self.registered_kv: dict[int, list[int]] = {}  # block hash -> the KV it stands for

    # ---- rules ----

    @rule(
        prefix=st.integers(0, len(PREFIXES) - 1),
        prefix_len=st.integers(0, 40),
        suffixes=st.lists(st.lists(st.integers(1, VOCAB - 1), max_size=8), min_size=1, max_size=3),
        max_tokens=st.integers(1, 12),
        ignore_eos=st.booleans(),
        priority=st.integers(0, 3),
    )
    def add(
        self,
        prefix: int,
        prefix_len: int,
        suffixes: list[list[int]],
        max_tokens: int,
        ignore_eos: bool,
        priority: int,
    ) -> None:
        """One to three requests that share a prompt prefix (and a priority, which only
        the priority policy reads)."""
        for suffix in suffixes:
            prompt = (PREFIXES[prefix][:prefix_len] + suffix)[: self.max_model_len] or [1]
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
            seq = Sequence(
                self._new_id(), prompt, params, eos_token_ids=frozenset({EOS}), priority=priority
            )
            self.seqs[seq.request_id] = seq
            self.sched.queues.add(seq)

    @rule(
        num_steps=st.integers(1, 4),
        tokens=st.lists(st.integers(0, VOCAB - 1), max_size=8),
        abort_mid=st.none() | st.integers(0, 7),
        abort_after=st.sampled_from([None, "swapped", "waiting"]),
        fork_after=st.none() | st.integers(0, 63),
        accepts=st.lists(st.integers(0, 4), max_size=8),
    )
    def step(
        self,
        num_steps: int,
        tokens: list[int],
        abort_mid: int | None,
        abort_after: str | None,
        fork_after: int | None,
        accepts: list[int],
    ) -> None:
        """A few engine steps; sampled tokens come from ``tokens``, then 1s; a sequence
        with draft tokens keeps as many of them as ``accepts`` says (none if it is empty).

        ``abort_mid`` aborts a scheduled sequence while the first step "runs";
        ``abort_after`` aborts the first sequence that lands in that queue, e.g. one
        just preempted (it rarely stays there until a separate abort rule runs);
        ``fork_after`` forks a running sequence after the first step, mid-generation.
        """
        for i in range(num_steps):
            self._step(tokens[i::num_steps], abort_mid if i == 0 else None, accepts[i::num_steps])
            if i == 0 and fork_after is not None:
                self.fork(fork_after)
            queue = getattr(self.sched.queues, abort_after) if abort_after else None
            if queue:
                event(f"abort {abort_after} after step")
                self._abort(queue[0])
                abort_after = None

    @rule(place=st.sampled_from(["swapped", "running", "waiting"]), index=st.integers(0, 63))
    def abort(self, place: str, index: int) -> None:
        """Abort a sequence, from the named queue when it has one (swapped ones are rare)."""
        queues = self.sched.queues
        queue = list(getattr(queues, place))
        live = queue or [*queues.waiting, *queues.running, *queues.swapped]
        if not live:
            return
        seq = live[index % len(live)]
        event(f"abort {seq.status.value}")
        self._abort(seq)

    @rule(index=st.integers(0, 63))
    def fork(self, index: int) -> None:
        """Give a running sequence a twin that shares its blocks (n > 1 choices)."""
        running = self.sched.queues.running
        if not running or len(running) >= self.sched.max_num_seqs:
            return
        parent = running[index % len(running)]
        event(
            "fork" + (" a partial block" if parent.num_computed_tokens % self.bm.block_size else "")
        )
        child = Sequence(
            self._new_id(),
            parent.prompt_token_ids,
            parent.sampling_params,
            eos_token_ids=parent.eos_token_ids,
            priority=parent.priority,
        )
        child.token_ids = list(parent.token_ids)
        self.bm.fork(parent, child)
        # No scheduler API for this yet: the child joins the batch as its newest member.
        child.status = SequenceStatus.RUNNING
        self.sched.queues.running.append(child)
        self.sched.queues.sequences[child.request_id] = child
        self.seqs[child.request_id] = child

    # ---- one engine step, checked ----

    def _step(
        self, tokens: list[int], abort_mid: int | None, accepts: list[int]
    ) -> SchedulerOutput:
        sched = self.sched
        running_before = list(sched.queues.running)
        waiting_before = list(sched.queues.waiting)
        swapped_before = list(sched.queues.swapped)
        out = sched.schedule()
        self._check_output(out, running_before, waiting_before, swapped_before)
        out = self.runner.execute(out, self.seqs, self.bm)
        for request_id in out.preempted:
            event(f"preempt to {self.seqs[request_id].status.value}")
        if out.blocks_to_swap_in:
            event("swap in")
        if out.blocks_to_copy:
            event("copy-on-write")
        scheduled = [self.seqs[s.request_id] for s in out.scheduled]
        if any(s.start > 0 for s in out.scheduled):
            event("chunk or decode with context")

        samplers = [s for s in out.scheduled if s.samples]
        if abort_mid is not None and out.scheduled:
            self._abort(scheduled[abort_mid % len(scheduled)])
        sampled = {}
        for k, item in enumerate(samplers):
            # The drafts the "model" confirms, then its own token.
            kept = accepts[k % len(accepts)] if accepts else 0
            new = [*item.draft_token_ids[:kept], tokens[k] if k < len(tokens) else 1]
            sampled[item.request_id] = [SampledToken(t, -1.0) for t in new]
            if item.num_draft_tokens:
                event(f"{min(kept, item.num_draft_tokens)} of {item.num_draft_tokens} accepted")
        before = {id(seq): (seq.num_computed_tokens, seq.num_tokens) for seq in scheduled}
        sched.update_from_output(out, ModelRunnerOutput(sampled))
        for item, seq in zip(out.scheduled, scheduled, strict=True):
            computed, num_tokens = before[id(seq)]
            if seq.status == SequenceStatus.FINISHED_ABORTED:
                continue
            self._remember_registered_kv(seq, item.block_table)
            new = sampled.get(seq.request_id, [])
            if seq.is_finished:  # a stop may cut the step's tokens short
                assert num_tokens < seq.num_tokens <= num_tokens + len(new)
            elif new:
                assert seq.num_tokens == num_tokens + len(new)
                assert seq.num_computed_tokens == seq.num_tokens - 1
            else:
                assert seq.num_tokens == num_tokens
                assert seq.num_computed_tokens == computed + item.num_new_tokens
            appended = seq.token_ids[num_tokens:]
            assert appended == [t.token_id for t in new][: len(appended)]
            if seq.is_finished:
                assert seq.block_table == [] and seq not in sched.queues.running
                last = seq.token_ids[-1]
                if seq.status == SequenceStatus.FINISHED_STOPPED:
                    assert last == EOS and not seq.sampling_params.ignore_eos
                else:
                    assert (
                        seq.num_output_tokens >= seq.sampling_params.max_tokens
                        or seq.num_tokens >= self.max_model_len
                    )
        return out

    def _check_output(
        self,
        out: SchedulerOutput,
        running_before: list[Sequence],
        waiting_before: list[Sequence],
        swapped_before: list[Sequence],
    ) -> None:
        sched = self.sched
        assert out.num_batched_tokens <= sched.max_num_batched_tokens
        assert len(out.scheduled) <= sched.max_num_seqs
        assert len(sched.queues.running) <= sched.max_num_seqs
        seqs = [self.seqs[s.request_id] for s in out.scheduled]
        assert len({id(s) for s in seqs}) == len(seqs)
        self._check_order(out, seqs, running_before, waiting_before, swapped_before)
        self._check_blocks(out, seqs)

    def _check_order(
        self,
        out: SchedulerOutput,
        seqs: list[Sequence],
        running_before: list[Sequence],
        waiting_before: list[Sequence],
        swapped_before: list[Sequence],
    ) -> None:
        """FCFS: who runs, who is preempted, who is admitted, in what order."""
        sched = self.sched
        # Preemption takes the newest running sequences, newest first.
        preempted = [self.seqs[request_id] for request_id in out.preempted]
        assert preempted == running_before[::-1][: len(out.preempted)]
        for seq in preempted:
            assert seq not in seqs
            assert seq.status in (SequenceStatus.WAITING, SequenceStatus.SWAPPED)
        if out.preempted:
            assert all(s in running_before for s in seqs)  # nothing new joins that step
        # Running first (in order), then swapped-in (in order), then admitted (FIFO).
        n_run = sum(s in running_before for s in seqs)
        n_swap = sum(s in swapped_before for s in seqs)
        assert [s for s in running_before if s in seqs] == seqs[:n_run]
        assert seqs[n_run : n_run + n_swap] == swapped_before[:n_swap]
        admitted = seqs[n_run + n_swap :]
        assert admitted == waiting_before[: len(admitted)]
        if admitted:
            assert not sched.queues.swapped

    def _check_blocks(self, out: SchedulerOutput, seqs: list[Sequence]) -> None:
        """What each scheduled sequence writes is its own, and copies land there."""
        sched, bm, bs = self.sched, self.bm, self.bm.block_size
        written: set[int] = set()
        for item, seq in zip(out.scheduled, seqs, strict=True):
            assert seq in sched.queues.running and seq.status == SequenceStatus.RUNNING
            assert item.block_table == seq.block_table
            assert item.num_new_tokens >= 1
            assert item.start + item.num_new_tokens - item.num_draft_tokens <= seq.num_tokens
            if item.num_draft_tokens:  # a decode step, never past max_tokens or the model
                assert item.start == seq.num_tokens - 1 and seq.num_output_tokens > 0
                room = seq.sampling_params.max_tokens - seq.num_output_tokens
                assert item.num_draft_tokens < min(room, self.max_model_len - seq.num_tokens)
            assert len(seq.block_table) * bs >= item.start + item.num_new_tokens
            first, last = item.start // bs, (item.start + item.num_new_tokens - 1) // bs
            for block_id in seq.block_table[first : last + 1]:
                # A block being written belongs to its writer alone and is not cached.
                block = bm.blocks[block_id]
                assert block.ref_count == 1, (seq, block)
                assert block.block_hash is None, (seq, block)
                assert block_id not in written
                written.add(block_id)
        for _, dst in out.blocks_to_copy:
            assert dst in written
        swapped_in = [gpu for _, gpu in out.blocks_to_swap_in]
        assert len(set(swapped_in)) == len(swapped_in)
        if out.blocks_to_swap_in:
            assert not out.blocks_to_swap_out

    def _remember_registered_kv(self, seq: Sequence, table: list[int]) -> None:
        """Record what each hash stands for; one hash must always mean the same KV.

        ``table`` is the block table the step ran with (a finished sequence's is gone).
        """
        bm, bs = self.bm, self.bm.block_size
        if not bm.enable_prefix_caching:
            return
        computed = seq.num_computed_tokens
        if self.runner.draft_gpu is not None:  # only blocks the draft has too
            computed = min(computed, seq.num_draft_computed_tokens)
        for i, block_id in enumerate(table[: computed // bs]):
            block_hash = bm.blocks[block_id].block_hash
            assert block_hash is not None, (seq, i)  # every computed full block is registered
            kv = [self.runner.kv(seq, i * bs + j) for j in range(bs)]
            assert self.registered_kv.setdefault(block_hash, kv) == kv, (seq, i)

    def _abort(self, seq: Sequence) -> None:
        self.sched.queues.finish(seq.request_id, SequenceStatus.FINISHED_ABORTED)
        assert seq.status == SequenceStatus.FINISHED_ABORTED and seq.block_table == []

    def _new_id(self) -> str:
        self.next_id += 1
        return f"r{self.next_id}"

    # ---- invariants, after every rule ----

    @invariant()
    def accounting(self) -> None:
        if not hasattr(self, "bm"):
            return
        bm, sched, bs = self.bm, self.sched, self.bm.block_size
        queues = sched.queues
        running, waiting, swapped = queues.running, list(queues.waiting), list(queues.swapped)
        assert len(running) <= sched.max_num_seqs

        # Every sequence is in exactly one place.
        places = [*running, *waiting, *swapped]
        assert len({id(s) for s in places}) == len(places)
        for seq in self.seqs.values():
            if seq.is_finished:
                assert seq not in places and seq.block_table == []
            else:
                assert seq in places
        for seq in running:
            assert seq.status == SequenceStatus.RUNNING
        for seq in waiting:
            assert seq.status == SequenceStatus.WAITING
            assert seq.block_table == [] and seq.num_computed_tokens == 0
        for seq in swapped:
            assert seq.status == SequenceStatus.SWAPPED

        # GPU blocks: ref counts are exactly the running sequences' tables.
        holders = [0] * bm.num_blocks
        for seq in running:
            assert len(set(seq.block_table)) == len(seq.block_table)
            assert len(seq.block_table) == -(-seq.num_computed_tokens // bs)
            for block_id in seq.block_table:
                holders[block_id] += 1
        assert [b.ref_count for b in bm.blocks] == holders
        free = set(bm.free_blocks)
        assert free == {i for i, n in enumerate(holders) if n == 0}
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
        assert bm.num_used_blocks == sum(n > 0 for n in holders)
        for block_hash, block_id in bm.cached_blocks.items():
            assert bm.blocks[block_id].block_hash == block_hash

        # CPU blocks: free + held by swapped sequences == total, none held twice.
        cpu_held = [b for seq in swapped for b in seq.block_table]
        cpu_all = cpu_held + bm.free_cpu_blocks
        assert sorted(cpu_all) == list(range(bm.num_cpu_blocks))

        # The KV every live sequence has computed is still where its table says.
        runner = self.runner
        for cache, seqs in ((runner.gpu, running), (runner.cpu, swapped)):
            for seq in seqs:
                for pos in range(seq.num_computed_tokens):
                    assert runner.read(cache, seq, pos) == runner.kv(seq, pos), (seq, pos)
        # A findable cached block (used or free) still holds the KV its hash stands for.
        for block_hash, block_id in bm.cached_blocks.items():
            assert len(bm.blocks[block_id].token_ids) == bs
            assert runner.gpu[block_id] == self.registered_kv[block_hash]
        if runner.draft_gpu is None or runner.draft_cpu is None:
            return
        # The draft model's KV: it never runs ahead of the target, what it has computed
        # is where the block table says, and a cached block holds it whole.
        for cache, seqs in ((runner.draft_gpu, running), (runner.draft_cpu, swapped)):
            for seq in seqs:
                assert seq.num_draft_computed_tokens <= seq.num_computed_tokens
                for pos in range(seq.num_draft_computed_tokens):
                    assert runner.read(cache, seq, pos) == runner.kv(seq, pos), (seq, pos)
        for block_hash, block_id in bm.cached_blocks.items():
            assert runner.draft_gpu[block_id] == self.registered_kv[block_hash]

    # ---- at the end: everything drains, nothing leaks ----

    def teardown(self) -> None:
        if not hasattr(self, "bm"):
            return
        sched, bm = self.sched, self.bm
        # Generous: each sequence needs at most max_model_len steps of work, plus
        # re-prefills after preemptions. Starvation would never finish.
        cap = 4 * self.max_model_len * (sched.queues.num_unfinished + 1) + 50
        steps = 0
        queues = sched.queues
        while queues.has_unfinished():
            assert steps < cap, f"no progress in {steps} steps: {queues.running} {queues.waiting}"
            self._step([], None, [])
            self.accounting()
            steps += 1
        assert all(seq.is_finished for seq in self.seqs.values())
        assert all(block.ref_count == 0 for block in bm.blocks)
        assert bm.num_free_blocks == bm.num_blocks
        assert sorted(bm.free_cpu_blocks) == list(range(bm.num_cpu_blocks))


class PressureMachine(SchedulerMachine):
    """The same machine on a cache too small for its batch: preemption every few steps."""

    @initialize(
        block_size=st.sampled_from([2, 4]),
        num_blocks=st.integers(3, 6),
        use_swap=st.booleans(),
        num_cpu_blocks=st.integers(2, 12),
        max_num_seqs=st.integers(2, 4),
        max_num_batched_tokens=st.integers(4, 16),
        enable_prefix_caching=st.booleans(),
    )
    def setup(  # a narrower, harsher set of configurations than the base machine's
        self,
        block_size: int,
        num_blocks: int,
        use_swap: bool,
        num_cpu_blocks: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_prefix_caching: bool,
    ) -> None:
        self._build(
            block_size,
            num_blocks,
            use_swap,
            num_cpu_blocks,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len=num_blocks * block_size,
            memory_threshold=1.0,
            enable_prefix_caching=enable_prefix_caching,
        )


class PriorityMachine(SchedulerMachine):
    """The priority policy on a small cache (by recompute: the policy takes no swap).
    Requests come with random priorities, so running ones are preempted for waiting
    ones of a higher priority, often in the step that had already scheduled them."""

    @initialize(
        block_size=st.sampled_from([2, 4]),
        num_blocks=st.integers(3, 8),
        max_num_seqs=st.integers(1, 4),
        max_num_batched_tokens=st.integers(2, 16),
        memory_threshold=st.sampled_from([1.0, 0.75]),
        enable_prefix_caching=st.booleans(),
    )
    def setup(  # the priority policy's own configurations
        self,
        block_size: int,
        num_blocks: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        memory_threshold: float,
        enable_prefix_caching: bool,
    ) -> None:
        self._build(
            block_size,
            num_blocks,
            use_swap=False,
            num_cpu_blocks=0,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=num_blocks * block_size,
            memory_threshold=memory_threshold,
            enable_prefix_caching=enable_prefix_caching,
            policy="priority",
        )

    def _check_order(
        self,
        out: SchedulerOutput,
        seqs: list[Sequence],
        running_before: list[Sequence],
        waiting_before: list[Sequence],
        swapped_before: list[Sequence],
    ) -> None:
        sched = self.sched
        assert not sched.queues.swapped and not out.blocks_to_swap_out
        # The waiting queue is in priority order, a preempted sequence included.
        waiting = list(sched.queues.waiting)
        assert waiting == sorted(waiting, key=priority_key)
        preempted = [self.seqs[request_id] for request_id in out.preempted]
        for seq in preempted:
            assert seq not in seqs and seq.status == SequenceStatus.WAITING
        # The victims are the lowest: everything that runs ranks at least as high.
        if preempted and seqs:
            assert max(map(priority_key, seqs)) <= min(map(priority_key, preempted))
        # Running ones go first, best first; then waiting ones, in the queue's order.
        ran = [s for s in seqs if s in running_before]
        assert seqs[: len(ran)] == ran == sorted(ran, key=priority_key)
        admitted = seqs[len(ran) :]
        assert admitted == waiting_before[: len(admitted)]
        if any(p in running_before for p in preempted) and admitted:
            event("preempted for a waiting sequence")


class SpeculativeMachine(SchedulerMachine):
    """Speculative decoding on a small cache: n-gram drafts of up to 3 tokens (the tiny
    vocabulary makes matches common), of which the fake model keeps a random number; the
    rejected drafts' slots must go back, and nothing they held may be cached."""

    @initialize(
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(3, 12),
        use_swap=st.booleans(),
        num_cpu_blocks=st.integers(2, 12),
        max_num_seqs=st.integers(1, 4),
        max_num_batched_tokens=st.integers(2, 16),
        max_model_len=st.integers(8, 40),
        enable_prefix_caching=st.booleans(),
        num_speculative_tokens=st.integers(1, 4),
    )
    def setup(  # the speculative machine's own configurations
        self,
        block_size: int,
        num_blocks: int,
        use_swap: bool,
        num_cpu_blocks: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_prefix_caching: bool,
        num_speculative_tokens: int,
    ) -> None:
        config = SpeculativeConfig(num_speculative_tokens, prompt_lookup_min=1, prompt_lookup_max=2)
        self._build(
            block_size,
            num_blocks,
            use_swap,
            num_cpu_blocks,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            memory_threshold=1.0,
            enable_prefix_caching=enable_prefix_caching,
            speculator=Speculator(config),
        )


class DraftModelMachine(SpeculativeMachine):
    """Speculative decoding with a draft model: the scheduler reserves slots that the
    (fake) draft model fills, and the draft's own KV, in the same blocks, must stay
    complete wherever it is read or cached while it lags behind the target in decode
    steps without drafts."""

    @initialize(
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(3, 12),
        use_swap=st.booleans(),
        num_cpu_blocks=st.integers(2, 12),
        max_num_seqs=st.integers(1, 4),
        max_num_batched_tokens=st.integers(2, 16),
        max_model_len=st.integers(8, 40),
        enable_prefix_caching=st.booleans(),
        num_speculative_tokens=st.integers(1, 4),
    )
    def setup(  # the speculative machine's configurations, with a draft model
        self,
        block_size: int,
        num_blocks: int,
        use_swap: bool,
        num_cpu_blocks: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_prefix_caching: bool,
        num_speculative_tokens: int,
    ) -> None:
        config = SpeculativeConfig(num_speculative_tokens, method="draft_model", model="draft")
        self._build(
            block_size,
            num_blocks,
            use_swap,
            num_cpu_blocks,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            memory_threshold=1.0,
            enable_prefix_caching=enable_prefix_caching,
            speculator=Speculator(config),
        )


_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
SchedulerMachine.TestCase.settings = _SETTINGS
PressureMachine.TestCase.settings = _SETTINGS
PriorityMachine.TestCase.settings = _SETTINGS
SpeculativeMachine.TestCase.settings = _SETTINGS
DraftModelMachine.TestCase.settings = _SETTINGS
test_scheduler_machine = SchedulerMachine.TestCase
test_scheduler_machine_under_memory_pressure = PressureMachine.TestCase
test_scheduler_machine_with_priorities = PriorityMachine.TestCase
test_scheduler_machine_with_speculation = SpeculativeMachine.TestCase
test_scheduler_machine_with_a_draft_model = DraftModelMachine.TestCase
