"""Kernel benchmarks on an NVIDIA GPU: the Triton kernels against the device's memory
bandwidth and against the torch references.

    python -m bench.kernels                      # Llama-3-8B-like shapes, bf16
    python -m bench.kernels --dtype float16 --batch 1,64 --context 1024,8192 --json out.json

Decode attention and RMSNorm are memory-bound: the figure of merit is achieved GB/s
(bytes that must move / time) as a fraction of the peak. The peak is the device's
spec (memory clock x bus width, where torch reports them) and a measured
device-to-device copy. Times are medians from triton.testing.do_bench (L2 flushed).
Exits with a message, and status 2, where no CUDA GPU is present.
"""

from __future__ import annotations

import argparse
import json
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
    return query, k_cache, v_cache, meta, moved * query.element_size()


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
            *tensors, nbytes = case
            ms = timed(paged_attention_triton, *tensors, scale)
            try:
                ref_ms = timed(paged_attention_ref, *tensors, scale)
            except torch.cuda.OutOfMemoryError:
                ref_ms = None  # the reference gathers every context into one tensor
            rows.append(
                _row("decode attention", f"B={batch} ctx={context}", nbytes, ms, ref_ms, peak)
            )
            del case, tensors
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
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)

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
