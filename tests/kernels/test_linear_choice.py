"""The choice between our bf16 kernel and oneDNN per projection and row bucket: how a
shape is timed (medians after a warm-up, over copies of its first rows), decided by
(fake) timings, kept per machine, and followed by the packed projections and the
one-call decoder stack."""

from __future__ import annotations

import json
import logging
import uuid
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hetero_infer.kernels import cpu_extension, linear_choice, linear_cpu
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.decoder_stack_cpu import CpuDecoderStack, _buckets_served
from hetero_infer.kernels.linear import GatedLinear
from hetero_infer.kernels.linear_choice import (
    KERNEL,
    MAX_COPIES,
    ONEDNN,
    ONEDNN_MARGIN,
    ROW_BUCKETS,
    STREAM_BYTES,
    TIMED_PAIRS,
    TIMED_ROWS,
    LinearChooser,
    ShapeChoice,
    machine_key,
    num_copies,
    pick,
    row_bucket,
    stream_timer,
    timed_pair,
)
from hetero_infer.kernels.linear_cpu import (
    KernelLinear,
    OneDnnLinear,
    RowSplitLinear,
    pack_gated_linear,
    pack_linear,
)
from hetero_infer.kernels.paged_attention_cpu import prepare_cpu_attention
from hetero_infer.kernels.quantized import quantize_int8

from tests.kernels.batches import make_batch


def fresh_flags(*flags: str) -> frozenset[str]:
    """CPU flags of a machine of its own: no choice measured in this process holds for it."""
    return frozenset({f"test-{uuid.uuid4().hex}", *flags})


def fake_timer(seconds: dict[str, tuple[float, ...]], calls: list | None = None):
    """A timer factory whose candidates take ``seconds[kind][bucket]``."""

    def factory():
        def time_call(kind: str, rows: int) -> float:
            if calls is not None:
                calls.append((kind, rows))
            return seconds[kind][TIMED_ROWS.index(rows)]

        return time_call

    return factory


# the timings one shape's measurement takes: both kernels, warm-up and pairs, per row count
TIMINGS = 2 * (TIMED_PAIRS + 1) * len(TIMED_ROWS)
OURS_THEN_ONEDNN = {KERNEL: (1.0, 1.0, 1.0, 1.0, 1.0), ONEDNN: (2.0, 0.95, 0.5, 0.3, 0.2)}


def test_rows_fall_in_their_buckets():
    assert [row_bucket(r) for r in (1, 2, 8, 9, 32, 33, 128, 129, 10_000)] == [
        0,
        1,
        1,
        2,
        2,
        3,
        3,
        4,
        4,
    ]
    assert [row_bucket(r) for r in TIMED_ROWS] == list(range(len(ROW_BUCKETS) + 1))


def test_onednn_replaces_ours_only_where_clearly_faster():
    # 0.95 is within the margin: a near tie keeps our kernel
    assert pick(tuple(zip(*OURS_THEN_ONEDNN.values(), strict=True))) == (
        KERNEL,
        KERNEL,
        ONEDNN,
        ONEDNN,
        ONEDNN,
    )
    # oneDNN exactly ONEDNN_MARGIN faster is still a tie
    assert pick(((ONEDNN_MARGIN, 1.0), (ONEDNN_MARGIN * 1.01, 1.0))) == (KERNEL, ONEDNN)


def test_a_choice_holds_for_its_cpu_model(monkeypatch):
    flags = fresh_flags()
    keys = {}
    for model in ("AMD EPYC 9654", "Intel Xeon Platinum 8592+", None):
        monkeypatch.setattr(linear_choice.cpu_isa, "cpu_model", lambda model=model: model)
        keys[model] = machine_key(flags)
    assert keys["AMD EPYC 9654"].startswith("AMD EPYC 9654|")
    assert keys["Intel Xeon Platinum 8592+"].startswith("Intel Xeon Platinum 8592+|")
    assert keys[None].startswith("unknown CPU|")


def test_a_key_without_the_kernel_sources_says_so(monkeypatch):
    def missing() -> str:
        raise OSError("no kernels/csrc")

    monkeypatch.setattr(linear_choice.cpu_build, "sources_digest", missing)
    assert machine_key(fresh_flags()).endswith("|no sources")


def test_measures_each_shape_once_per_machine():
    flags, calls = fresh_flags(), []
    chooser = LinearChooser("measure", None, flags=flags)
    choice = chooser.choose("64x32", fake_timer(OURS_THEN_ONEDNN, calls))
    assert choice.kernels == (KERNEL, KERNEL, ONEDNN, ONEDNN, ONEDNN)
    assert choice.source == "measured" and len(choice.seconds) == len(TIMED_ROWS)
    assert len(calls) == TIMINGS
    # another engine on the same machine, in the same process: no timing again
    again = LinearChooser("measure", None, flags=flags).choose("64x32", fake_timer({}, calls))
    assert again == choice and len(calls) == TIMINGS
    # another shape is timed
    LinearChooser("measure", None, flags=flags).choose("32x32", fake_timer(OURS_THEN_ONEDNN, calls))
    assert len(calls) == 2 * TIMINGS


def test_a_cache_file_keeps_the_choice_per_machine(tmp_path):
    cache = tmp_path / ".cache" / "hetero-infer" / "choices.json"  # folders made as needed
    flags = fresh_flags()
    LinearChooser("measure", cache, flags).choose("64x32", fake_timer(OURS_THEN_ONEDNN))
    machines = json.loads(cache.read_text())
    (key,) = machines
    assert machines[key] == {"64x32": "kernel/kernel/onednn/onednn/onednn"}
    linear_choice._MEASURED.clear()  # a new process: only the file remembers
    calls: list = []
    cached = LinearChooser("measure", cache, flags).choose("64x32", fake_timer({}, calls))
    assert cached.kernels == (KERNEL, KERNEL, ONEDNN, ONEDNN, ONEDNN)
    assert cached.source == "cached" and calls == []
    # another machine (another CPU flag) measures its own and keeps the first's
    other = LinearChooser("measure", cache, fresh_flags("amx_bf16"))
    other.choose("64x32", fake_timer({KERNEL: (1.0,) * 5, ONEDNN: (2.0,) * 5}, calls))
    assert len(calls) == TIMINGS and len(json.loads(cache.read_text())) == 2


def test_a_cache_that_cannot_be_written_is_warned_of(tmp_path, caplog):
    """A folder where the file should be: read nor kept, and the choice still made."""
    with caplog.at_level(logging.WARNING):
        choice = LinearChooser("measure", tmp_path, fresh_flags()).choose(
            "64x32", fake_timer(OURS_THEN_ONEDNN)
        )
    assert choice.source == "measured" and "cannot keep the kernel choices" in caplog.text


def test_an_unreadable_cache_is_measured_over(tmp_path, caplog):
    cache = tmp_path / "choices.json"
    cache.write_text("{not json")
    calls: list = []
    with caplog.at_level(logging.WARNING):
        choice = LinearChooser("measure", cache, fresh_flags()).choose(
            "64x32", fake_timer(OURS_THEN_ONEDNN, calls)
        )
    assert choice.source == "measured" and calls and "cannot read" in caplog.text


def test_each_candidate_takes_its_median_after_a_warm_up():
    """The two alternate, a warm-up call of each first, which does not count."""
    pairs = range(1, TIMED_PAIRS + 1)
    seconds = {KERNEL: iter([100.0, *pairs]), ONEDNN: iter([100.0, *reversed(pairs)])}
    calls: list = []

    def time_call(kind: str, rows: int) -> float:
        calls.append((kind, rows))
        return next(seconds[kind])

    median = (TIMED_PAIRS + 1) / 2
    assert timed_pair(time_call, 16) == (median, median)
    assert calls == [(KERNEL, 16), (ONEDNN, 16)] * (TIMED_PAIRS + 1)


def test_a_timing_is_one_pass_over_the_copies(monkeypatch):
    """Seconds a call: a pass over the candidate's copies (packed at its first timing),
    divided among them."""
    clock = [100.0]
    monkeypatch.setattr(linear_choice, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    packed = []

    def candidates(kind: str) -> list:
        packed.append(kind)

        def linear(x: torch.Tensor) -> None:  # a second a row
            clock[0] += len(x)

        return [linear] * 3

    time_call = stream_timer(candidates, 32)
    assert [time_call(KERNEL, 4), time_call(KERNEL, 2), time_call(ONEDNN, 1)] == [4.0, 2.0, 1.0]
    assert packed == [KERNEL, ONEDNN]


@pytest.mark.parametrize(
    ("shape", "timed_rows", "copies"),
    [
        ((10000, 4096), 8192, 1),  # 80 MiB: its first 64 MiB of rows
        ((100, 2**20), 64, 1),  # rows of 2 MiB: never fewer than 64
        ((64, 96), 64, MAX_COPIES),  # whole, and copied
    ],
)
def test_a_shape_is_timed_on_copies_of_its_first_rows(shape, timed_rows, copies):
    packed: dict[str, list[torch.Tensor]] = {KERNEL: [], ONEDNN: []}
    inputs: list[torch.Tensor] = []

    def packer(kind: str):
        def pack(weight: torch.Tensor):
            packed[kind].append(weight)
            return inputs.append  # the projection: the rows it is given, kept

        return pack

    weight = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    time_call = linear_cpu.copies_timer(weight, packer(KERNEL), packer(ONEDNN))
    time_call(KERNEL, 3)
    time_call(ONEDNN, 3)
    for kind in (KERNEL, ONEDNN):
        assert [tuple(w.shape) for w in packed[kind]] == [(timed_rows, shape[1])] * copies
    assert [tuple(x.shape) for x in inputs] == [(3, shape[1])] * (2 * copies)


def test_a_timing_streams_enough_copies_to_leave_the_cache():
    def bf16_weight(size: int) -> torch.Tensor:
        return torch.empty(size // 2, dtype=torch.bfloat16, device="meta")

    assert num_copies(bf16_weight(STREAM_BYTES // 4)) == 4
    assert num_copies(bf16_weight(STREAM_BYTES // 4 + 1024)) == 4  # the last a part
    assert num_copies(bf16_weight(2 * STREAM_BYTES)) == 1
    assert num_copies(bf16_weight(1024)) == MAX_COPIES


@pytest.mark.parametrize("entry", ["kernel/onednn", "kernel/kernel/fastest/onednn/onednn"])
def test_a_cached_entry_that_is_no_choice_is_measured_over(tmp_path, entry):
    """An entry needs a known kernel for each bucket (one written for other buckets, or
    by hand, is not one)."""
    cache, flags = tmp_path / "choices.json", fresh_flags()
    cache.write_text(json.dumps({machine_key(flags): {"64x32": entry}}))
    calls: list = []
    choice = LinearChooser("measure", cache, flags).choose(
        "64x32", fake_timer(OURS_THEN_ONEDNN, calls)
    )
    assert choice.source == "measured" and len(calls) == TIMINGS


@pytest.mark.parametrize(
    ("mode", "flags", "on_tiles", "expected", "source"),
    [
        ("rule", (), False, (KERNEL,) * 5, "rule"),
        ("rule", ("amx_bf16",), False, (KERNEL, ONEDNN, ONEDNN, ONEDNN, ONEDNN), "rule"),
        ("rule", ("amx_bf16",), True, (KERNEL,) * 5, "rule"),  # ours on the tiles too
        ("kernel", ("amx_bf16",), False, (KERNEL,) * 5, "forced"),
        ("onednn", (), False, (ONEDNN,) * 5, "forced"),
    ],
)
def test_rule_and_forced_modes_time_nothing(mode, flags, on_tiles, expected, source):
    calls: list = []
    chooser = LinearChooser(mode, None, flags=fresh_flags(*flags), kernel_on_tiles=on_tiles)
    choice = chooser.choose("64x32", fake_timer({}, calls))
    assert (choice.kernels, choice.source, calls) == (expected, source, [])
    assert f"64x32: {'/'.join(expected)} ({source})" in chooser.table()


def test_the_rule_asks_the_kernels_whether_ours_runs_on_the_tiles():
    """On a CPU with AMX the rule gives ours every row count where it runs on the tiles
    (faster than oneDNN's up to 256 rows), else oneDNN's tiles from 2 rows."""
    module = load_cpu_kernels()
    if module is None:
        pytest.skip("the C++ kernels did not build (test_kernel_builds_here says so)")
    amx_cpu = fresh_flags("amx_bf16")
    before = module.set_amx_tiles(False)
    try:
        off = LinearChooser("rule", None, flags=amx_cpu).choose("64x32", fake_timer({}))
    finally:
        module.set_amx_tiles(before)
    assert off.kernels == (KERNEL, ONEDNN, ONEDNN, ONEDNN, ONEDNN)
    on = LinearChooser("rule", None, flags=amx_cpu).choose("64x32", fake_timer({}))
    assert on.kernels == ((KERNEL,) * 5 if module.amx_tiles_ready() else off.kernels)


@pytest.mark.parametrize(
    ("kernels", "expected"),
    [
        (None, (KERNEL, ONEDNN, ONEDNN, ONEDNN, ONEDNN)),  # not built: oneDNN's tiles
        (SimpleNamespace(amx_tiles_ready=lambda: False), (KERNEL, ONEDNN, ONEDNN, ONEDNN, ONEDNN)),
        (SimpleNamespace(amx_tiles_ready=lambda: True), (KERNEL,) * 5),
    ],
    ids=["not built", "ours off the tiles", "ours on the tiles"],
)
def test_the_rule_follows_the_kernels_on_any_cpu(monkeypatch, kernels, expected):
    """The same, whatever this CPU has: the kernels' answer given."""
    monkeypatch.setattr(cpu_extension, "load_cpu_kernels", lambda: kernels)
    chooser = LinearChooser("rule", None, flags=fresh_flags("amx_bf16"))
    assert chooser.choose("64x32", fake_timer({})).kernels == expected


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="cpu_linear_kernel"):
        LinearChooser("fastest")


def test_the_decoder_stack_serves_only_buckets_ours_runs_everywhere():
    choice = ShapeChoice((KERNEL, KERNEL, ONEDNN, KERNEL, ONEDNN), "rule")
    split = RowSplitLinear(SimpleNamespace(gated=False, out_features=4), print, choice)
    layer = SimpleNamespace(qkv=split, o=object(), gate_up=None, down=object())
    served = _buckets_served(SimpleNamespace(layers=[layer]))
    assert served == (True, True, False, True, False)
    # where projections' choices differ, the buckets ours runs for all of them
    other = RowSplitLinear(
        split.kernel, print, ShapeChoice((KERNEL, ONEDNN, KERNEL, KERNEL, ONEDNN), "rule")
    )
    second = SimpleNamespace(qkv=object(), o=object(), gate_up=None, down=other)
    both = _buckets_served(SimpleNamespace(layers=[layer, second]))
    assert both == (True, False, False, True, False)
    plain = SimpleNamespace(qkv=object(), o=object(), gate_up=None, down=object())
    assert _buckets_served(SimpleNamespace(layers=[plain])) is None
    # a step of so many decodes: the stack takes it where ours runs that bucket
    stack = CpuDecoderStack(object(), served)
    for decodes, expected in [(1, True), (20, False), (100, True), (200, False)]:
        batch = make_batch([(3, 1)] * decodes, 16, 1, 1, 16, torch.bfloat16)
        assert stack.serves(prepare_cpu_attention(batch.inputs, 16, {None})) == expected


# ---- the packed projections, on the real kernels ----

module = load_cpu_kernels()
needs_both = pytest.mark.skipif(
    module is None
    or not module.linear_packed_available()
    or not torch.backends.mkldnn.is_available()
    or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="needs our bf16 kernel and oneDNN's bf16 matmul",
)
MIXED = {KERNEL: (1.0, 1.0, 1.0, 1.0, 1.0), ONEDNN: (2.0, 0.5, 2.0, 0.5, 0.5)}


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


def mixed_chooser(monkeypatch) -> LinearChooser:
    """A chooser whose measurement finds ours at 1 and 9-32 rows, oneDNN elsewhere."""
    monkeypatch.setattr(linear_cpu, "copies_timer", lambda *args: fake_timer(MIXED)())
    return LinearChooser("measure", None, flags=fresh_flags())


@needs_both
@pytest.mark.parametrize("rows", [1, 5, 20, 100, 300])
def test_each_call_runs_the_kernel_chosen_for_its_rows(monkeypatch, rows):
    # gated: ours applies SiLU to its fp32 sums, oneDNN's route to bf16 ones, so the two
    # differ in some bits (plain projections agree to the bit here)
    weight = randn(128, 96, seed=1)
    split = pack_gated_linear(weight, None, module, mixed_chooser(monkeypatch), module.silu_and_mul)
    assert isinstance(split, RowSplitLinear)
    x = randn(rows, 96)
    ours = KernelLinear(module, weight, gated=True)(x)
    onednn = GatedLinear(OneDnnLinear(weight), module.silu_and_mul, "silu")(x)
    assert not torch.equal(ours, onednn)
    expected = ours if rows in (1, 20) else onednn
    assert torch.equal(split(x), expected)
    assert torch.equal(split(x.view(1, rows, 96)), expected.view(1, rows, 64))
    plain = pack_linear(weight, None, module, mixed_chooser(monkeypatch))
    assert isinstance(plain, RowSplitLinear) and plain.out_features == 128
    assert torch.equal(plain(x), OneDnnLinear(weight)(x))


@needs_both
@pytest.mark.parametrize("rows", [1, 5])
def test_gated_rows_and_lora_addends_take_the_same_split(monkeypatch, rows):
    weight = randn(128, 96, seed=1)  # gate then up, 64 each
    gated = pack_gated_linear(weight, None, module, mixed_chooser(monkeypatch), module.silu_and_mul)
    assert isinstance(gated, RowSplitLinear) and gated.gated and gated.out_features == 64
    x = randn(rows, 96)
    for addend in (None, torch.randn(rows, 128) * 0.1):
        sums = x.float() @ weight.float().T + (0 if addend is None else addend)
        expected = F.silu(sums[:, :64]) * sums[:, 64:]
        actual = gated(x, addend=addend)
        assert actual.dtype == torch.bfloat16 and actual.shape == (rows, 64)
        assert (actual.float() - expected).abs().max() < 0.02 * expected.abs().max()


@needs_both
def test_a_shape_ours_wins_everywhere_packs_ours_alone(monkeypatch):
    monkeypatch.setattr(
        linear_cpu, "copies_timer", lambda *args: fake_timer({KERNEL: (1,) * 5, ONEDNN: (2,) * 5})()
    )
    chooser = LinearChooser("measure", None, flags=fresh_flags())
    assert isinstance(pack_linear(randn(64, 96), None, module, chooser), KernelLinear)
    forced = LinearChooser("onednn", flags=fresh_flags())
    assert isinstance(pack_linear(randn(64, 96), None, module, forced), OneDnnLinear)


@needs_both
def test_a_split_projection_shows_and_places_our_packed_weight(monkeypatch):
    """(the one-call stack reads it, huge pages move it)"""
    split = pack_linear(randn(64, 96), None, module, mixed_chooser(monkeypatch))
    assert isinstance(split, RowSplitLinear) and split.packed is split.kernel.packed
    moved = split.packed.clone()
    split.packed = moved
    assert split.kernel.packed is moved


@needs_both
def test_gated_and_plain_projections_of_a_shape_are_chosen_apart(monkeypatch):
    chooser = mixed_chooser(monkeypatch)
    pack_linear(randn(128, 96), None, module, chooser)
    pack_gated_linear(randn(128, 96), None, module, chooser, module.silu_and_mul)
    assert list(chooser.chosen) == ["128x96", "128x96 gated"]


@pytest.mark.cpu_kernels("quantized_linear")
def test_a_chooser_lets_quantized_projections_onto_bf16_tiles():
    """Both give up results independent of the batch for speed: so together."""
    weight = quantize_int8(torch.randn(64, 96))
    assert pack_linear(weight, None, module).bf16_tiles is None
    chooser = LinearChooser("kernel", None, flags=fresh_flags())
    assert pack_linear(weight, None, module, chooser).bf16_tiles is not None
