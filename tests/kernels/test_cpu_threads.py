"""The C++ CPU kernels at 1 to 4 threads (torch.set_num_threads, restored after each
test): the same bits at every count, and the plain torch references' results, with
output sizes that give threads odd runs of panels.

Every kernel splits its work with torch's at::parallel_for (or, for the attention
kernels, into at::get_num_threads() parts: csrc/parallel_by_work.h), compiled into the
extension with -fopenmp: an ``omp parallel`` region of the calling thread's OpenMP
thread count, which torch.set_num_threads sets. None asks OpenMP for a count of its
own, so torch's count holds as long as the extension shares torch's OpenMP runtime
(the first test). at::parallel_for gives each thread one run of consecutive items
(``thread_runs``), so which code paths run depends on the count: the quantized kernel
takes its panels two at a time past a few rows and the odd one last, alone; with 2
threads an even count of panels is an odd run each only when half of it is odd.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hetero_infer.kernels.cpu_build import SOURCE_DIR
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.linear_quantized import KERNEL_TYPES, PANEL, QuantizedLinear
from hetero_infer.kernels.paged_attention import store_kv_ref
from hetero_infer.kernels.paged_attention_cpu import (
    paged_attention_cpu,
    prepare_cpu_attention,
    tiled_kernel_serves,
)

from tests.kernels.batches import make_batch
from tests.kernels.checks import assert_close
from tests.kernels.test_cpu_attention import SCALE, padded_reference
from tests.kernels.test_cpu_linear import assert_matches_fp32
from tests.kernels.test_quantized_linear import assert_matches_reference, randn, raw_weight

THREADS = [1, 2, 3, 4]
ROWS = [1, 9, 37]  # a decode; past the quantized kernel's few rows (8), in tiles of 5 + 4


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def thread_runs(items: int, threads: int, grain: int) -> list[int]:
    """How at::parallel_for(0, items, grain) splits its items (ATen/ParallelOpenMP.h):
    one thread unless there are more items than the grain; else each of min(threads,
    ceil(items / grain)) threads one run of ceil(items / that) items in turn, the last
    run what is left."""
    if threads == 1 or items <= max(grain, 1):
        return [items]
    used = min(threads, -(-items // grain))
    chunk = -(-items // used)
    return [min(chunk, items - start) for start in range(0, items, chunk)]


def cpp_constant(file: str, name: str) -> int:
    """A ``constexpr int64_t name = N;`` (or ``N << S``) of kernels/csrc/``file``."""
    source = (SOURCE_DIR / file).read_text()
    found = re.search(rf"constexpr int64_t {name} = (\d+)(?: << (\d+))?;", source)
    assert found is not None, f"{name} in {file}"
    return int(found.group(1)) << int(found.group(2) or 0)


@pytest.fixture(scope="module")
def module():
    if load_cpu_kernels() is None:
        pytest.skip("the C++ kernels did not build (test_cpu_attention says so)")
    return load_cpu_kernels()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_kernels_share_torchs_openmp_runtime(module):
    """One OpenMP runtime in the process once the extension is loaded (it links
    libgomp.so.1 by name, which resolves to the one torch loaded), and its thread count
    is the one torch.set_num_threads gives."""
    runtimes = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if re.fullmatch(r"lib(g|i)?omp[0-9]*\.so.*", Path(path).name):
            runtimes.add(path)
    assert len(runtimes) == 1, runtimes
    openmp = ctypes.CDLL(runtimes.pop())  # the loaded library, not a second copy
    for count in THREADS:
        with torch_threads(count):
            assert openmp.omp_get_max_threads() == count


def test_thread_runs_follow_aten():
    assert thread_runs(5, 2, 1) == [3, 2]
    assert thread_runs(6, 2, 1) == [3, 3]
    assert thread_runs(5, 4, 1) == [2, 2, 1]  # three threads get work
    assert thread_runs(9, 4, 1) == [3, 3, 3]
    assert thread_runs(9, 4, 5) == [5, 4]  # the grain leaves 2 threads work
    assert thread_runs(4, 4, 4) == [4]
    assert thread_runs(7, 1, 1) == [7]


# ---- the quantized linear kernel: panels of 16 outputs ----

# 5 and 9 panels leave a thread an odd run at every count from 1 to 4; 6 only at 2
# threads (3 + 3).
PANELS = [5, 6, 9]
# Inputs enough for one panel a thread at 9 rows (the kernel's least work per thread,
# kMinThreadWork, is in weight bytes x rows).
IN_FEATURES = 1024
QUANTIZED = "quantized_linear_cpu.cpp"
DTYPES = [torch.float32, torch.bfloat16]


@functools.cache
def quantized_linear(qtype: str, panels: int) -> QuantizedLinear:
    weight = raw_weight(qtype, PANEL * panels, IN_FEATURES)
    return QuantizedLinear(load_cpu_kernels(), weight, randn(PANEL * panels, seed=2))


@functools.cache
def one_thread_outputs(qtype: str, panels: int) -> dict[tuple[int, torch.dtype], torch.Tensor]:
    """The kernel's outputs for each row count and dtype on one thread, checked against
    the reference (in fp32: bf16's are the same sums, rounded)."""
    weight = raw_weight(qtype, PANEL * panels, IN_FEATURES)
    linear = quantized_linear(qtype, panels)
    outputs = {}
    for rows in ROWS:
        for dtype in DTYPES:
            x = randn(rows, IN_FEATURES, seed=rows, dtype=dtype)
            with torch_threads(1):
                outputs[rows, dtype] = linear(x)
            if dtype == torch.float32:
                assert_matches_reference(outputs[rows, dtype], x, weight, linear.bias)
    return outputs


@pytest.mark.cpu_kernels("quantized_linear")
@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("panels", PANELS)
@pytest.mark.parametrize("qtype", KERNEL_TYPES)
def test_quantized_linear_at_any_thread_count(qtype, panels, threads):
    linear = quantized_linear(qtype, panels)
    expected = one_thread_outputs(qtype, panels)
    assert cpp_constant("quantized_format.h", "kPanel") == PANEL
    few_rows = cpp_constant(QUANTIZED, "kFewRows")
    min_work = cpp_constant(QUANTIZED, "kMinThreadWork")
    tails = 0
    for rows in ROWS:
        for dtype in DTYPES:
            with torch_threads(threads):
                split = linear(randn(rows, IN_FEATURES, seed=rows, dtype=dtype))
            # Each output is one thread's, summed the same way whichever thread it is.
            assert torch.equal(split, expected[rows, dtype]), (rows, dtype)
        grain = max(1, min_work // (linear.packed.shape[1] * rows))
        # Past a few rows a panel is work enough for a thread of its own.
        assert grain == 1 or rows <= few_rows, (rows, grain)
        tails += rows > few_rows and any(run % 2 for run in thread_runs(panels, threads, grain))
    if panels % 2 or threads == 2:
        assert tails > 0, "no thread took an odd run of paired panels: the tail never ran"


# ---- the bf16 linear kernel: panels of 32 outputs, gated or not ----


@pytest.mark.cpu_kernels("linear_packed")
@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("panels", [1, 5, 7])
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_linear_packed_at_any_thread_count(module, gated, panels, threads):
    in_features = 256
    weight = randn(32 * panels, in_features, seed=1, dtype=torch.bfloat16) * 0.2
    bias = None if gated else randn(32 * panels, seed=2, dtype=torch.bfloat16)
    packed = (module.pack_gated_linear_weight if gated else module.pack_linear_weight)(weight)
    for rows in ROWS:
        x = randn(rows, in_features, seed=rows, dtype=torch.bfloat16)
        with torch_threads(1):
            alone = module.linear_packed(x, packed, bias, gated)
        with torch_threads(threads):
            split = module.linear_packed(x, packed, bias, gated)
        assert torch.equal(split, alone), rows
        if not gated:
            assert_matches_fp32(split, x, weight, bias)
            continue
        gate, up = torch.nn.functional.linear(x.float(), weight.float()).chunk(2, dim=-1)
        expected = torch.nn.functional.silu(gate) * up
        scale = expected.abs().clamp_min(1.0)
        assert ((split.float() - expected).abs() / scale).max() < 2 * 2**-7


# ---- attention: decodes and chunks, split by their work ----

BLOCK_SIZE = 16
# Decodes at several context lengths, first chunks and chunks after cached context.
MIXED = [(0, 37), (15, 1), (21, 50), (0, 2), (48, 16), (5, 1), (0, 1), (40, 17), (100, 1)]


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_attention_at_any_thread_count(module, dtype, threads):
    """The tiled prefill kernel (the chunks) beside the per-token kernel (the decodes;
    one sequence's heads split among threads where there are fewer sequences than
    threads)."""
    batch = make_batch(MIXED, BLOCK_SIZE, 2, 3, 64, dtype, seed=7)
    store_kv_ref(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.inputs.slot_mapping)
    meta = prepare_cpu_attention(batch.inputs, BLOCK_SIZE, {None})
    args = (module, batch.query, batch.k_cache, batch.v_cache, meta, SCALE)
    if module.prefill_attention_available():
        assert tiled_kernel_serves(module, batch.query, batch.k_cache, None)
    with torch_threads(1):
        alone = paged_attention_cpu(*args)
    with torch_threads(threads):
        split = paged_attention_cpu(*args)
    assert torch.equal(split, alone)
    assert_close(split, padded_reference(batch, None), dtype, f"{threads} threads")
    # One decoding sequence: fewer sequences than threads.
    single = make_batch([(70, 1)], BLOCK_SIZE, 4, 2, 64, dtype, seed=8)
    store_kv_ref(
        single.key, single.value, single.k_cache, single.v_cache, single.inputs.slot_mapping
    )
    meta = prepare_cpu_attention(single.inputs, BLOCK_SIZE, {None})
    with torch_threads(threads):
        split = paged_attention_cpu(
            module, single.query, single.k_cache, single.v_cache, meta, SCALE
        )
    assert_close(split, padded_reference(single, None), dtype, "one sequence")
