"""LoRA's grouped updates: the C++ kernel (bf16 and fp32, on the CPU) and the Triton
kernel (interpreter) against the torch reference computed in fp64, on a step whose
rows use several adapters and none, each adapter on some of the merged projection's
parts (q/k/v), up to rank 64."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.lora import add_lora_ref, cpu_lora_ops, pack_lora_ref

from tests.kernels.checks import assert_close

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
