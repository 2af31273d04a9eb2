"""LoRA's grouped updates: the C++ kernel (bf16 and fp32, on the CPU) and the Triton
kernel (interpreter) against the torch reference computed in fp64, on a step whose
rows use several adapters and none, each adapter on some of the merged projection's
parts (q/k/v), up to rank 64."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.lora import add_lora_ref, cpu_lora_ops, pack_lora_ref

from tests.kernels.checks import assert_close, refusals, strided

IN, COLUMNS = 72, 120  # q 72 columns, k and v 24 each


def random(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def adapter(rank: int, parts: list[tuple[int, int]], seed: int):
    """A [R, in] and its parts (out_start, rank_start, B) on the given (start, width)."""
    a = random(rank * len(parts), IN, seed=seed) / IN**0.5
    placed = [
        (start, i * rank, random(width, rank, seed=seed + 1 + i) / rank**0.5)
        for i, (start, width) in enumerate(parts)
    ]
    return a, placed


ADAPTERS = [
    adapter(8, [(0, 72), (72, 24), (96, 24)], seed=1),  # q, k, v
    adapter(64, [(0, 72), (96, 24)], seed=10),  # q, v at rank 64
    adapter(4, [(72, 24)], seed=20),  # k only
]
# 11 rows: adapter 0, none, 1, 2, 0, 1, none, 2, 2, 0, 1
ROW_ADAPTERS = [0, None, 1, 2, 0, 1, None, 2, 2, 0, 1]


def groups_of(pack, dtype):
    groups = []
    for index, (a, parts) in enumerate(ADAPTERS):
        rows = torch.tensor([r for r, i in enumerate(ROW_ADAPTERS) if i == index])
        packed = pack(a.to(dtype), [(o, k, b.to(dtype)) for o, k, b in parts])
        groups.append((rows, packed))
    return groups


def cpu_pack(a: torch.Tensor, parts: list) -> object:
    """One adapter's weights packed for the C++ kernel."""
    module = load_cpu_kernels()
    assert module is not None
    return module.LoRAWeights(
        a, [p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts]
    )


def expected_out(x: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """The reference in fp64."""
    return add_lora_ref(base.double(), x.double(), groups_of(pack_lora_ref, torch.float64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_cpu_kernel_matches_the_reference(dtype):
    module = load_cpu_kernels()
    x = random(len(ROW_ADAPTERS), IN, seed=100).to(dtype)
    base = random(len(ROW_ADAPTERS), COLUMNS, seed=101).to(dtype)
    groups = groups_of(cpu_pack, dtype)
    out = base.clone()
    module.lora_add(out, x, [rows for rows, _ in groups], [w for _, w in groups])
    assert_close(out, expected_out(x, base).to(dtype), dtype, "lora_add")
    untouched = [r for r, i in enumerate(ROW_ADAPTERS) if i is None]
    assert torch.equal(out[untouched], base[untouched])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_colocated_weights_give_the_same_updates(dtype):
    """colocate_lora moves a projection's adapters' weights into one buffer (twice here,
    the second time without the first adapter, as after an unload): the updates stay
    the same to the bit."""
    pack, add, colocate = cpu_lora_ops(load_cpu_kernels())
    x = random(len(ROW_ADAPTERS), IN, seed=30).to(dtype)
    base = random(len(ROW_ADAPTERS), COLUMNS, seed=31).to(dtype)
    groups = groups_of(pack, dtype)
    before = add(base.clone(), x, groups)
    colocate([weights for _, weights in groups])
    colocate([weights for _, weights in groups[1:]])  # again, without the first
    assert torch.equal(add(base.clone(), x, groups), before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_assign_sets_out_to_the_updates_alone(dtype):
    """assign (a gated gate_up's fp32 updates): whatever out held, it ends as the updates
    added to zeros, and zero on the rows of no adapter."""
    pack, add, _ = cpu_lora_ops(load_cpu_kernels())
    x = random(len(ROW_ADAPTERS), IN, seed=40).to(dtype)
    groups = groups_of(pack, dtype)
    garbage = torch.full((len(ROW_ADAPTERS), COLUMNS), float("nan"))
    assigned = add(garbage, x, groups, assign=True)
    assert torch.equal(assigned, add(torch.zeros(len(ROW_ADAPTERS), COLUMNS), x, groups))
    untouched = [r for r, i in enumerate(ROW_ADAPTERS) if i is None]
    assert not assigned[untouched].any()
    reference_groups = groups_of(pack_lora_ref, torch.float32)
    reference = add_lora_ref(garbage.clone(), x.float(), reference_groups, assign=True)
    assert torch.equal(reference[untouched], assigned[untouched])


def test_cpu_ops_pack_bf16_and_fp32_for_the_kernel_and_fp16_for_the_reference():
    pack, add, _ = cpu_lora_ops(load_cpu_kernels())
    bf16 = torch.bfloat16
    x = random(len(ROW_ADAPTERS), IN, seed=7).to(bf16)
    base = random(len(ROW_ADAPTERS), COLUMNS, seed=8).to(bf16)
    groups = groups_of(pack, bf16)
    assert type(groups[0][1]).__name__ == "LoRAWeights"
    out = add(base.clone(), x, groups)
    assert_close(out, expected_out(x, base).to(bf16), bf16, "bf16 ops")
    assert type(groups_of(pack, torch.float32)[0][1]).__name__ == "LoRAWeights"
    assert type(groups_of(pack, torch.float16)[0][1]).__name__ == "LoRAWeightsRef"
    # One adapter for every row (rows None), as a single stream's step gives it.
    a, parts = ADAPTERS[0]
    whole = add(
        base.clone(), x, [(None, pack(a.to(bf16), [(o, k, b.to(bf16)) for o, k, b in parts]))]
    )
    double = pack_lora_ref(a.double(), [(o, k, b.double()) for o, k, b in parts])
    reference = add_lora_ref(base.double(), x.double(), [(None, double)])
    assert_close(whole, reference.to(bf16), bf16, "all rows")


def test_cpu_kernel_adds_bf16_rows_updates_into_fp32():
    """The updates a gated gate_up kernel adds to its sums: bf16 rows and weights,
    summed into an fp32 out (rows of no adapter stay as they were)."""
    module = load_cpu_kernels()
    bf16 = torch.bfloat16
    x = random(len(ROW_ADAPTERS), IN, seed=400).to(bf16)
    base = random(len(ROW_ADAPTERS), COLUMNS, seed=401)
    groups = groups_of(cpu_pack, bf16)
    out = base.clone()
    module.lora_add(out, x, [rows for rows, _ in groups], [w for _, w in groups])
    expected = expected_out(x, base.to(bf16)).float() - base.to(bf16).float() + base
    # The rows' updates rounded once (bf16 ranks, fp32 sums): well within bf16's ulp
    assert_close(out, expected, bf16, "fp32 out")
    untouched = [r for r, i in enumerate(ROW_ADAPTERS) if i is None]
    assert torch.equal(out[untouched], base[untouched])


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 37])
def test_cpu_kernel_on_many_rows_of_one_adapter(rows):
    """A prefill chunk's rows: split among work items of at most 16 rows, each in tiles
    of up to 4 (tiles of every size among the counts, on one thread or two)."""
    module = load_cpu_kernels()
    bf16 = torch.bfloat16
    a, parts = ADAPTERS[1]
    x = random(rows, IN, seed=300).to(bf16)
    base = random(rows, COLUMNS, seed=301).to(bf16)
    packed = cpu_pack(a.to(bf16), [(o, k, b.to(bf16)) for o, k, b in parts])
    out = base.clone()
    module.lora_add(out, x, [None], [packed])
    double = pack_lora_ref(a.double(), [(o, k, b.double()) for o, k, b in parts])
    reference = add_lora_ref(base.double(), x.double(), [(None, double)])
    assert_close(out, reference.to(bf16), bf16, f"{rows} rows")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("in_features, width", [(100, 150), (16, 64), (5, 3)])
def test_cpu_kernel_on_any_width(dtype, in_features, width):
    """Inputs and outputs of every length the kernel's vectors split: four vectors of
    16 floats, single ones, and the values left over (100 = 64 + 2 x 16 + 4)."""
    module = load_cpu_kernels()
    a = random(8, in_features, seed=500) / in_features**0.5
    b = random(width, 8, seed=501) / 8**0.5
    x = random(6, in_features, seed=502).to(dtype)
    base = random(6, width, seed=503).to(dtype)
    out = base.clone()
    module.lora_add(out, x, [None], [cpu_pack(a.to(dtype), [(0, 0, b.to(dtype))])])
    reference = add_lora_ref(
        base.double(), x.double(), [(None, pack_lora_ref(a.double(), [(0, 0, b.double())]))]
    )
    assert_close(out, reference.to(dtype), dtype, f"in {in_features}, width {width}")


def lora_weights_arguments(case: str, dtype: torch.dtype = torch.bfloat16) -> tuple:
    """LoRAWeights' arguments: A of rank 8 on q, k and v (the most parts) at ranks 0-3,
    4-6 and 7 (up to A's last rank, the last of rank 1), but for ``case``."""
    a = random(8, IN, seed=600).to(dtype)
    out_starts, rank_starts = [0, 72, 96], [0, 4, 7]
    bs = [random(width, rank, seed=601).to(dtype) for width, rank in [(72, 4), (24, 3), (24, 1)]]
    match case:
        case "3-d A":
            a = a[None]
        case "an output start short":
            out_starts = out_starts[:2]
        case "a rank start short":
            rank_starts = rank_starts[:2]
        case "four parts":
            out_starts, rank_starts, bs = [*out_starts, 0], [*rank_starts, 0], [*bs, bs[2]]
        case "1-d B":
            bs[1] = bs[1][:, 0]
        case "fp32 B":
            bs[1] = bs[1].float()
        case "rank 0":
            bs[2] = bs[2][:, :0]
        case "a rank start before A's":
            rank_starts[0] = -1
        case "ranks past A's":
            rank_starts[1] = 6
        case "an output start before out's":
            out_starts[2] = -1
    return a, out_starts, rank_starts, bs


LORA_WEIGHTS_REFUSALS = {
    r"A \[R, in\]": ["3-d A"],
    "one output start and one rank start per B": ["an output start short", "a rank start short"],
    r"at most three parts \(q, k, v\)": ["four parts"],
    r"B \[width, rank\]": ["1-d B", "fp32 B"],
    r"B \[width, rank >= 1\]": ["rank 0"],
    "B's ranks within A's": ["a rank start before A's", "ranks past A's"],
    "a part's first output column": ["an output start before out's"],
}


@pytest.mark.parametrize(("case", "message"), refusals(LORA_WEIGHTS_REFUSALS))
def test_lora_weights_refuse_parts_they_cannot_place(case, message):
    module = load_cpu_kernels()
    module.LoRAWeights(*lora_weights_arguments("none"))
    with pytest.raises(RuntimeError, match=message):
        module.LoRAWeights(*lora_weights_arguments(case))


def lora_add_arguments(case: str) -> tuple:
    """lora_add's arguments: one adapter's rows 0 and 3 of 4, out as wide as its parts
    reach, but for ``case``."""
    module = load_cpu_kernels()
    dtype = torch.float16 if case == "fp16 throughout" else torch.bfloat16
    weights = [module.LoRAWeights(*lora_weights_arguments("none", dtype))]
    out, x = torch.zeros(4, COLUMNS, dtype=dtype), torch.zeros(4, IN, dtype=dtype)
    rows = [torch.tensor([0, 3])]
    match case:
        case "a row past the tokens" | "a row before them":
            rows = [torch.tensor([0, 4 if case == "a row past the tokens" else -1])]
        case "rows of no adapter":
            rows = [*rows, torch.tensor([1])]
        case "1-d x":
            x = x[0]
        case "1-d out":
            out = out[0]
        case "out of fewer tokens":
            out = out[:3]
        case "strided out":
            out = strided(out)
        case "fp16 out":
            out = out.half()
        case "fp32 x":
            x, out = x.float(), out.float()
        case "x of another width":
            x = torch.zeros(4, IN + 2, dtype=dtype)
        case "out short of v's columns":
            out = out[:, :-1].contiguous()
    return out, x, rows, weights


LORA_ADD_REFUSALS = {
    "a LoRA row out of range": ["a row past the tokens", "a row before them"],
    "one set of rows per adapter": ["rows of no adapter"],
    r"x \[tokens, in\]": ["1-d x"],
    r"x, out \[tokens, \.\]": ["1-d out", "out of fewer tokens"],
    "x and out contiguous": ["strided out"],
    "out in x's dtype or in fp32": ["fp16 out"],
    r"A \[R, in\] in x's dtype": ["fp32 x", "x of another width"],
    "a LoRA part past out's columns": ["out short of v's columns"],
    "lora_add: bf16 or fp32": ["fp16 throughout"],
}


@pytest.mark.parametrize(("case", "message"), refusals(LORA_ADD_REFUSALS))
def test_lora_add_refuses_what_it_cannot_run(case, message):
    module = load_cpu_kernels()
    module.lora_add(*lora_add_arguments("none"))
    with pytest.raises(RuntimeError, match=message):
        module.lora_add(*lora_add_arguments(case))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"]
)
def test_triton_kernel_matches_the_reference(dtype):
    pytest.importorskip("triton")
    from hetero_infer.kernels.lora_triton import add_lora_triton, pack_lora_triton

    x = random(len(ROW_ADAPTERS), IN, seed=200).to(dtype)
    base = random(len(ROW_ADAPTERS), COLUMNS, seed=201).to(dtype)
    out = add_lora_triton(base.clone(), x, groups_of(pack_lora_triton, dtype))
    assert_close(out, expected_out(x, base).to(dtype), dtype, "add_lora_triton")
    untouched = [r for r, i in enumerate(ROW_ADAPTERS) if i is None]
    assert torch.equal(out[untouched], base[untouched])
