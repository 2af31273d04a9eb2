"""Kernel benchmarks on an NVIDIA GPU: the Triton kernels against the device's memory
bandwidth and against the torch references.

    python -m bench.kernels                      # Llama-3-8B-like shapes, bf16
    python -m bench.kernels --dtype float16 --batch 1,64 --context 1024,8192 --json out.json

Decode attention, RMSNorm and the linear layers at decode's few rows are memory-bound:
the figure of merit is achieved GB/s (bytes that must move / time) as a fraction of
the peak. The peak is the device's spec (memory clock x bus width, where torch reports
them) and a measured device-to-device copy. The linear layers are the Triton kernel on
quantized weights (``--qtypes``, at ``--rows`` rows) in the same shapes' projections
(merged qkv, o, merged gate_up, down; ``--intermediate`` the MLP's width), against
torch's matmul on the unquantized weight. Times are medians from
triton.testing.do_bench (L2 flushed). Exits with a message, and status 2, where no
CUDA GPU is present.

    python -m bench.kernels --cpu-linear         # the CPU's linear kernels, no GPU needed
    python -m bench.kernels --cpu-linear --qtypes Q4_1 --rows 1,64 --threads 2

``--cpu-linear`` times the quantized linear kernel (kernels/csrc/quantized_linear_cpu.cpp)
per GGUF type against the bf16 kernel (``linear_packed``) on SmolLM2-135M's projections
(merged qkv, o, merged gate_up, down) in all 30 layers, each layer its own copy of the
weights as in a decode step, so that they stream from memory (tens of MB, past the
caches). The K-quants (Q4_K, Q5_K, Q6_K) hold only rows of a multiple of 256 values:
they run the down projections alone ("down"), against bf16 on the same. Per row count:
the pass's time (fastest of ``--repeats``, which a shared machine disturbs least; and
the median), GB/s of weight bytes (the figure of merit at 1 row; torch's sum over 1 GiB
is printed beside) and GFLOP/s (at many rows).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    # Run as a file: import the repository's kernels package, not this file.
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch

from bench.common import parse_ints


def peak_bandwidth(device: torch.device) -> tuple[float | None, float]:
    """(spec GB/s or None, measured copy GB/s)."""
    import triton.testing

    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", None)
    bus_bits = getattr(props, "memory_bus_width", None)
    spec = 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9 if clock_khz and bus_bits else None
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=50)
    measured = 2 * src.numel() / (ms * 1e-3) / 1e9  # read + write
    return spec, measured


def timed(fn: Any, *args: Any) -> float:
    """Median milliseconds of fn(*args)."""
    import triton.testing

    return triton.testing.do_bench(lambda: fn(*args))


def copies_past_cache(nbytes: int, device: torch.device) -> int:
    """How many copies of ``nbytes`` of operands fill twice the GPU's L2 cache: cycled
    through, each call reads its copy from memory, as a model's layers read theirs."""
    cache = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
    return max(2, -(-2 * cache // max(nbytes, 1)))


def graph_timed(calls: list[Any], rounds: int = 4, replays: int = 10) -> float:
    """Median milliseconds of one call as a CUDA graph replays it: the device's time
    without the host's launches (the engine's decode steps replay graphs), the calls
    taken in turn, each on its own copy of the operands (``copies_past_cache``)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiled and warm before the capture
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(rounds):
            for call in calls:
                call()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / (rounds * len(calls)))
    return statistics.median(times)


def decode_case(
    batch: int,
    context: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
):
    """A decode step: every sequence has ``context`` cached tokens (this one included),
    its blocks scattered over the cache."""
    from hetero_infer.kernels.attention_backend import AttentionInputs
    from hetero_infer.kernels.paged_attention import prepare_torch_attention

    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    tables = torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq)
    inputs = AttentionInputs(
        slot_mapping=torch.zeros(batch, dtype=torch.long, device=device),
        block_tables=tables.to(torch.int32),
        context_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
        max_query_len=1,
        max_context_len=context,
    )
    meta = prepare_torch_attention(inputs, block_size, {None})  # the reference's masks
    query = torch.randn(batch, num_heads, head_dim, dtype=dtype, device=device)
    moved = (2 * batch * context * num_kv_heads + 2 * batch * num_heads) * head_dim
    return query, k_cache, v_cache, inputs, meta, moved * query.element_size()


def bench_decode(args: argparse.Namespace, device: torch.device, peak: float) -> list[dict]:
    from hetero_infer.kernels.paged_attention import paged_attention_ref
    from hetero_infer.kernels.paged_attention_triton import paged_attention_triton

    dtype = getattr(torch, args.dtype)
    scale = args.head_dim**-0.5
    rows = []
    for batch in args.batch:
        for context in args.context:
            case = decode_case(
                batch,
                context,
                args.num_heads,
                args.num_kv_heads,
                args.head_dim,
                args.block_size,
                dtype,
                device,
            )
            # The Triton kernel takes the inputs themselves as its metadata; given the
            # reference's, it would run the reference.
            query, k_cache, v_cache, inputs, meta, nbytes = case
            ms = timed(paged_attention_triton, query, k_cache, v_cache, inputs, scale)
            try:
                ref_ms = timed(paged_attention_ref, query, k_cache, v_cache, meta, scale)
            except torch.cuda.OutOfMemoryError:
                ref_ms = None  # the reference gathers every context into one tensor
            rows.append(
                _row("decode attention", f"B={batch} ctx={context}", nbytes, ms, ref_ms, peak)
            )
            del case, query, k_cache, v_cache
            torch.cuda.empty_cache()
    return rows


def bench_rms_norm(args: argparse.Namespace, device: torch.device, peak: float) -> list[dict]:
    from hetero_infer.kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
    from hetero_infer.kernels.rms_norm_triton import fused_add_rms_norm_triton, rms_norm_triton

    dtype = getattr(torch, args.dtype)
    hidden = args.num_heads * args.head_dim
    weight = torch.randn(hidden, dtype=dtype, device=device)
    rows = []
    for tokens in args.tokens:
        x = torch.randn(tokens, hidden, dtype=dtype, device=device)
        residual = torch.randn_like(x)
        size = x.numel() * x.element_size()
        ms = timed(rms_norm_triton, x, weight, 1e-5)
        ref_ms = timed(rms_norm_ref, x, weight, 1e-5)
        rows.append(_row("rms_norm", f"T={tokens} H={hidden}", 2 * size, ms, ref_ms, peak))
        ms = timed(fused_add_rms_norm_triton, x, residual, weight, 1e-5)
        ref_ms = timed(fused_add_rms_norm_ref, x, residual, weight, 1e-5)
        rows.append(
            _row("fused_add_rms_norm", f"T={tokens} H={hidden}", 4 * size, ms, ref_ms, peak)
        )
    return rows


# Where a GGUF block keeps its fp16 scales (first byte, how many), per type (llama.cpp's
# layouts): Q4_1, Q5_1, Q4_K and Q5_K begin with d and a min, the others with d, but Q6_K
# ends with it.
SCALE_FIELDS = {
    "Q8_0": (0, 1),
    "Q4_0": (0, 1),
    "Q4_1": (0, 2),
    "Q5_0": (0, 1),
    "Q5_1": (0, 2),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208, 1),
}
# The types of 256-value super-blocks, which gguf-py does not quantize.
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")


def linear_projections(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(out, in) of the decoder layer's projections as the engine merges them: qkv, o,
    gate_up, down."""
    hidden = args.num_heads * args.head_dim
    qkv = hidden + 2 * args.num_kv_heads * args.head_dim
    return [
        (qkv, hidden),
        (hidden, hidden),
        (2 * args.intermediate, hidden),
        (hidden, args.intermediate),
    ]


def timing_weight(qtype: str, n: int, k: int, device: torch.device) -> Any:
    """A QuantizedWeight of random bytes: the kernel does the same work whatever they
    hold, so only the scales are made small finite fp16 values (no inf or NaN sums)."""
    from hetero_infer.kernels.linear_quantized_triton import BLOCK_BYTES
    from hetero_infer.kernels.quantized import INT8, QuantizedWeight, row_bytes

    if qtype == INT8:
        values = torch.randint(-127, 128, (n, k), dtype=torch.int8, device=device)
        scales = torch.rand(n, device=device) * 0.01
        return QuantizedWeight(qtype, values, (n, k), scales)
    data = torch.randint(0, 256, (n, row_bytes(qtype, k)), dtype=torch.uint8, device=device)
    start, count = SCALE_FIELDS[qtype]
    blocks = data.view(n, -1, BLOCK_BYTES[qtype])
    halves = torch.rand(n, blocks.shape[1], count, device=device) * 0.01
    blocks[..., start : start + 2 * count] = halves.half().view(torch.uint8)
    return QuantizedWeight(qtype, data, (n, k))


def bench_linear(args: argparse.Namespace, device: torch.device, peak: float) -> list[dict]:
    import torch.nn.functional as F
    from hetero_infer.kernels.linear_quantized_triton import quantized_linear_triton

    dtype = getattr(torch, args.dtype)
    rows = []
    for n, k in linear_projections(args):
        dense = torch.randn(n, k, dtype=dtype, device=device)
        dense_bytes = dense.numel() * dense.element_size()
        for qtype in args.qtypes:
            weight = timing_weight(qtype, n, k, device)
            for m in args.rows:
                x = torch.randn(m, k, dtype=dtype, device=device)
                moved = (m * k + m * n) * x.element_size()
                ms = timed(quantized_linear_triton, x, weight)
                ref_ms = timed(F.linear, x, dense)
                shape = f"N={n} K={k} M={m}"
                row = _row(f"linear {qtype}", shape, weight.nbytes + moved, ms, ref_ms, peak)
                # torch's own share of the bandwidth, reading the unquantized weight.
                row["torch_gb_per_s"] = (dense_bytes + moved) / (ref_ms * 1e-3) / 1e9
                rows.append(row)
            del weight
        del dense
        torch.cuda.empty_cache()
    return rows


def _row(
    kernel: str, shape: str, nbytes: int, ms: float, ref_ms: float | None, peak: float
) -> dict[str, Any]:
    gbps = nbytes / (ms * 1e-3) / 1e9
    return {
        "kernel": kernel,
        "shape": shape,
        "triton_us": ms * 1e3,
        "torch_us": None if ref_ms is None else ref_ms * 1e3,
        "speedup": None if ref_ms is None else ref_ms / ms,
        "gb_per_s": gbps,
        "fraction_of_peak": gbps / peak,
    }


# ---- the CPU's linear kernels ----

# SmolLM2-135M's projections (out, in), as the engine merges them, and its layers.
SMOLLM2_PROJECTIONS = ((960, 576), (576, 576), (3072, 576), (576, 1536))
SMOLLM2_LAYERS = 30
# Copies of a layer's weights past 30 where 30 are less than this (the K-quants' down
# projections: 15 MB), so that no pass finds the previous one's in the caches.
CPU_FLUSH_BYTES = 128 << 20


def cpu_read_bandwidth(repeats: int) -> float:
    """GB/s of the fastest of ``repeats`` sums over 1 GiB of fp32 (far past the caches)."""
    src = torch.ones(2**28, dtype=torch.float32)  # filled: no page faults while timed
    return src.numel() * 4 / min(_cpu_times(src.sum, repeats)) / 1e9


def _cpu_times(fn: Any, repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` runs of fn() after one untimed one."""
    import time

    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def cpu_projections(kind: str) -> tuple[tuple[int, int], ...]:
    """The SmolLM2 projections a type can hold: the K-quants' 256-value super-blocks
    need in_features % 256 == 0, which only the down projection (1536) has (a GGUF
    file of SmolLM2 stores the others in another type)."""
    if kind in K_QUANTS:
        return tuple((n, k) for n, k in SMOLLM2_PROJECTIONS if k % 256 == 0)
    return SMOLLM2_PROJECTIONS


def gguf_blocks(kind: str, n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """uint8 [n, row bytes] of a GGUF type: random floats quantized by gguf-py, or for
    the K-quants (which gguf-py does not quantize) random bytes with small fp16 d."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    if kind not in K_QUANTS:
        values = torch.randn(n, k, generator=generator).numpy()
        return torch.from_numpy(gguf.quants.quantize(values, qtype))
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    data = torch.randint(
        0, 256, (n, k // 256 * block_bytes), dtype=torch.uint8, generator=generator
    )
    blocks = data.view(n, k // 256, block_bytes)
    start, count = SCALE_FIELDS[kind]
    halves = torch.rand(n, k // 256, count, generator=generator) * 0.01
    blocks[..., start : start + 2 * count] = halves.half().view(torch.uint8)
    return data


def cpu_linear_layers(
    kind: str, module: Any, projections: tuple[tuple[int, int], ...]
) -> tuple[list[Any], int]:
    """(one callable x -> y per projection of every layer, in the order a step runs
    them; their weights' bytes) for ``kind``: "bf16" (linear_packed), a GGUF type or
    I8 (int8 rows quantized from random floats).
    Every layer (30, or more: CPU_FLUSH_BYTES) gets its own copy of the packed weights
    (random values)."""
    from hetero_infer.kernels.linear_quantized import QuantizedLinear
    from hetero_infer.kernels.quantized import INT8, quantize_int8

    generator = torch.Generator().manual_seed(0)
    if kind == "bf16":
        packed = [
            module.pack_linear_weight(torch.randn(n, k, generator=generator).bfloat16())
            for n, k in projections
        ]

        def bind(weight: torch.Tensor) -> Any:
            return lambda x: module.linear_packed(x, weight, None)
    elif kind == INT8:
        packed = [
            QuantizedLinear(module, quantize_int8(torch.randn(n, k, generator=generator))).packed
            for n, k in projections
        ]

        def bind(weight: torch.Tensor) -> Any:
            return lambda x: module.quantized_linear(x, weight, kind, None)
    else:
        packed = [
            module.pack_quantized_weight(gguf_blocks(kind, n, k, generator), kind)
            for n, k in projections
        ]

        def bind(weight: torch.Tensor) -> Any:
            return lambda x: module.quantized_linear(x, weight, kind, None)

    layer_bytes = sum(p.numel() * p.element_size() for p in packed)
    copies = max(SMOLLM2_LAYERS, -(-CPU_FLUSH_BYTES // layer_bytes))
    calls = [bind(p.clone()) for _ in range(copies) for p in packed]
    return calls, copies * layer_bytes


def bench_cpu_linear(args: argparse.Namespace) -> list[dict[str, Any]]:
    from hetero_infer.kernels.cpu_extension import load_cpu_kernels

    module = load_cpu_kernels()
    if module is None or not module.linear_packed_available():
        raise SystemExit("--cpu-linear needs the CPU kernels built with AVX-512 (BW)")
    qtypes = args.qtypes if module.quantized_linear_available() else []
    results = []
    # bf16 first on each set of projections, the types that hold that set after it.
    for projections in dict.fromkeys(cpu_projections(kind) for kind in qtypes or ["bf16"]):
        kinds = ["bf16"] + [kind for kind in qtypes if cpu_projections(kind) == projections]
        results += bench_cpu_linear_kinds(module, kinds, projections, args)
    return results


def bench_cpu_linear_kinds(
    module: Any,
    kinds: list[str],
    projections: tuple[tuple[int, int], ...],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    shapes = "all" if projections == SMOLLM2_PROJECTIONS else "down"
    rows_out, bf16_rate = [], {}  # bf16's GFLOP/s per row count (copies may differ)
    for kind in kinds:
        calls, nbytes = cpu_linear_layers(kind, module, projections)
        layers = len(calls) // len(projections)
        inputs = [k for _, k in projections] * layers  # each call's in_features
        flops_per_row = 2 * layers * sum(n * k for n, k in projections)
        for rows in args.rows:
            xs = {k: torch.randn(rows, k).bfloat16() for k in set(inputs)}

            def step(
                calls: list[Any] = calls,
                xs: dict[int, torch.Tensor] = xs,
                inputs: list[int] = inputs,
            ) -> None:
                for call, k in zip(calls, inputs, strict=True):
                    call(xs[k])

            times = _cpu_times(step, args.repeats)
            best, median = min(times), statistics.median(times)
            rate = flops_per_row * rows / best / 1e9
            if kind == "bf16":
                bf16_rate[rows] = rate
            rows_out.append(
                {
                    "kernel": kind,
                    "projections": shapes,
                    "rows": rows,
                    "best_ms": best * 1e3,
                    "median_ms": median * 1e3,
                    "weight_bytes": nbytes,
                    "gb_per_s": nbytes / best / 1e9,
                    "gb_per_s_median": nbytes / median / 1e9,
                    "gflop_per_s": rate,
                    "speedup_vs_bf16": rate / bf16_rate[rows],
                }
            )
        del calls
    return rows_out


def print_cpu_linear(rows: list[dict[str, Any]], read_gbps: float) -> None:
    # torch's sum is no bandwidth test of its own: the kernels, which ask for the
    # weights ahead of use, read faster.
    print(f"torch's sum over 1 GiB of fp32: {read_gbps:.1f} GB/s")
    print(
        f"{'kernel':<6} {'shapes':<6} {'rows':>5} {'best ms':>8} {'median ms':>10} "
        f"{'weight MB':>10} {'GB/s':>6} {'GFLOP/s':>8} {'vs bf16':>8}"
    )
    for r in rows:
        print(
            f"{r['kernel']:<6} {r['projections']:<6} {r['rows']:>5} {r['best_ms']:>8.2f} "
            f"{r['median_ms']:>10.2f} "
            f"{r['weight_bytes'] / 1e6:>10.1f} {r['gb_per_s']:>6.1f} {r['gflop_per_s']:>8.0f} "
            f"{r['speedup_vs_bf16']:>7.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--batch", type=parse_ints, default="1,8,32,128", help="decode batch sizes")
    parser.add_argument(
        "--context", type=parse_ints, default="512,2048,8192", help="decode context lengths"
    )
    parser.add_argument("--tokens", type=parse_ints, default="1,64,1024,8192", help="RMSNorm rows")
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--intermediate", type=int, default=14336, help="the MLP's width")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--cpu-linear", action="store_true", help="the CPU's linear kernels instead (no GPU)"
    )
    parser.add_argument(
        "--qtypes",
        type=lambda t: t.split(","),
        default="Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q4_K,Q5_K,Q6_K,I8",
        help="the linear layers' GGUF types, and I8 (weight-only int8)",
    )
    parser.add_argument(
        "--rows", type=parse_ints, default="1,16,128,512", help="the linear layers' rows of x"
    )
    parser.add_argument("--threads", type=int, default=2, help="--cpu-linear: torch threads")
    parser.add_argument("--repeats", type=int, default=10, help="--cpu-linear: timed passes")
    args = parser.parse_args(argv)

    if args.cpu_linear:
        torch.set_num_threads(args.threads)
        read_gbps = cpu_read_bandwidth(args.repeats)
        rows = bench_cpu_linear(args)
        print_cpu_linear(rows, read_gbps)
        if args.json:
            result = {"read_gb_per_s": read_gbps, "threads": args.threads, "results": rows}
            Path(args.json).write_text(json.dumps(result, indent=2))
        return 0

    if not torch.cuda.is_available():
        print(
            "bench/kernels.py measures the Triton kernels on an NVIDIA GPU, and none is "
            "available here (torch.cuda.is_available() is False). The kernels' correctness "
            "is checked on the CPU by tests/kernels (Triton's interpreter).",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda")
    spec, measured = peak_bandwidth(device)
    peak = spec or measured
    name = torch.cuda.get_device_name(device)
    spec_text = f"{spec:.0f} GB/s spec, " if spec else ""
    print(f"{name}: {spec_text}{measured:.0f} GB/s measured copy; fractions are of {peak:.0f}")
    rows = bench_decode(args, device, peak) + bench_rms_norm(args, device, peak)
    rows += bench_linear(args, device, peak)
    print(
        f"{'kernel':<20} {'shape':<22} {'triton us':>10} {'torch us':>10} {'speedup':>8} "
        f"{'GB/s':>8} {'of peak':>8}"
    )
    for r in rows:
        torch_us = f"{r['torch_us']:.1f}" if r["torch_us"] is not None else "oom"
        speedup = f"{r['speedup']:.1f}x" if r["speedup"] is not None else "-"
        print(
            f"{r['kernel']:<20} {r['shape']:<22} {r['triton_us']:>10.1f} {torch_us:>10} "
            f"{speedup:>8} {r['gb_per_s']:>8.0f} {r['fraction_of_peak']:>8.0%}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": name, "peak_gb_per_s": peak, "results": rows}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
