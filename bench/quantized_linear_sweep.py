"""The GPU's linear layers on quantized weights: the engine's tiles against others, and
a GEMV-shaped candidate kernel, on one GPU (about 4 minutes on an H200).

    python -m bench.quantized_linear_sweep           # needs a GPU
    python -m bench.quantized_linear_sweep --quick   # the engine's tiles and torch only

For each of Llama-8B's projection shapes (6144 x 4096, 4096 x 14336, 28672 x 4096), each
type (Q8_0, Q4_0, Q4_K, Q6_K, I8) and 1 and 16 rows of bf16 activations it times:

- ``current``: kernels/linear_quantized_triton.py with the tiles choose_tiles picks;
- ``torch_us``: torch's matmul on a bf16 weight of the same shape (2 to 4 times the
  bytes);
- ``best_tiles``: the same kernel's fastest tiles among block_n 16/32/64, 1 to 16 K
  splits and 2 or 4 warps, while the first 110 s last (so: the first shape);
- ``gemv_best`` (Q8_0 and Q4_0): the fastest configuration of ``gemv_kernel`` below
  while the first 230 s last, each checked against x @ dequantize(W)^T first.

``gemv_kernel`` is a candidate design, not the engine's: no tl.dot; a program decodes a
tile [rows of W, blocks, 32] read along each row (the bytes of a row's blocks are
contiguous, so neighbouring threads read neighbouring bytes), scales it to fp32 and
reduces x * w over K in registers. Times are triton.testing.do_bench's (median of the
runs in 40 ms, after 10 ms of warm-up). Written: bench/results/
quantized-linear-sweep-<device>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch
import triton
import triton.language as tl
from hetero_infer.kernels.linear_quantized_triton import (
    BLOCK_BYTES,
    QuantizedTiles,
    _load_fp16,
    choose_tiles,
    device_info,
    loop_steps,
    quantized_linear_triton,
)

from bench.common import RESULTS_DIR, checkout_commit
from bench.gpu_check import device_slug
from bench.kernels import timing_weight

SHAPES = ((6144, 4096), (4096, 14336), (28672, 4096))
QTYPES = ("Q8_0", "Q4_0", "Q4_K", "Q6_K", "I8")
GEMV_QTYPES = ("Q8_0", "Q4_0")
ROWS = (1, 16)
TILES_BUDGET_S = 110  # from the start: the engine kernel's tile sweep
GEMV_BUDGET_S = 230  # from the start: the candidate's sweep


@triton.jit
def gemv_kernel(
    out_ptr,
    x_ptr,
    w_ptr,
    stride_out_split,
    stride_x,
    stride_w,
    M,
    N,
    num_blocks,
    blocks_per_split,
    QTYPE: tl.constexpr,
    BYTES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CH: tl.constexpr,
):
    """Split program_id(1)'s fp32 partial sums of x [M, K] @ dequant(w)^T for outputs
    program_id(0) * BLOCK_N...; CH blocks of 32 values per loop step (Q8_0, Q4_0)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    c = tl.arange(0, CH)
    t = tl.arange(0, 32)
    n_mask = n < N
    w_rows = w_ptr + n.to(tl.int64) * stride_w  # [BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = tl.program_id(1) * blocks_per_split
    last = tl.minimum(first + blocks_per_split, num_blocks)
    for b0 in range(first, last, CH):
        block = b0 + c
        live = block < last
        head = w_rows[:, None] + block[None, :] * BYTES  # [BLOCK_N, CH]
        head_mask = n_mask[:, None] & live[None, :]
        d = _load_fp16(head, head_mask)
        values_at = head[:, :, None] + 2  # after the block's fp16 scale
        values_mask = head_mask[:, :, None]
        if QTYPE == "Q8_0":
            q = tl.load(values_at + t[None, None, :], mask=values_mask, other=0)
            q = q.to(tl.int8, bitcast=True).to(tl.float32)
        else:  # byte j: value j in its low nibble, j + 16 in its high one
            nibbles = tl.load(values_at + (t % 16)[None, None, :], mask=values_mask, other=0)
            q = (((nibbles.to(tl.int32) >> (t // 16 * 4)[None, None, :]) & 0xF) - 8).to(tl.float32)
        w = tl.reshape(q * d[:, :, None], (BLOCK_N, CH * 32))
        x = tl.load(
            x_ptr + m[:, None, None] * stride_x + block[None, :, None] * 32 + t[None, None, :],
            mask=(m < M)[:, None, None] & live[None, :, None],
            other=0.0,
        ).to(tl.float32)
        x = tl.reshape(x, (BLOCK_M, CH * 32))
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    dst = out_ptr + tl.program_id(1) * stride_out_split + m[:, None] * N + n[None, :]
    tl.store(dst, acc, mask=(m < M)[:, None] & n_mask[None, :])


def gemv(x, weight, block_m, block_n, blocks_per_step, splits, warps, stages):
    """x [M, K] @ dequant(weight)^T by gemv_kernel, in x's dtype."""
    out_features, in_features = weight.shape
    num_blocks = in_features // 32
    per_split = triton.cdiv(triton.cdiv(num_blocks, splits), blocks_per_step) * blocks_per_step
    splits = triton.cdiv(num_blocks, per_split)
    partial = torch.empty((splits, x.shape[0], out_features), dtype=torch.float32, device=x.device)
    gemv_kernel[(triton.cdiv(out_features, block_n), splits)](
        partial,
        x,
        weight.data,
        x.shape[0] * out_features,
        x.stride(0),
        weight.data.stride(0),
        x.shape[0],
        out_features,
        num_blocks,
        per_split,
        QTYPE=weight.qtype,
        BYTES=BLOCK_BYTES[weight.qtype],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        CH=blocks_per_step,
        num_warps=warps,
        num_stages=stages,
    )
    return (partial[0] if splits == 1 else partial.sum(0)).to(x.dtype)


def timed_us(fn, *args, **kwargs) -> float:
    return triton.testing.do_bench(lambda: fn(*args, **kwargs), warmup=10, rep=40) * 1e3


def best_engine_tiles(x, weight, start: float) -> tuple[str, float] | None:
    best = None
    for block_n, splits, warps in itertools.product((16, 32, 64), (1, 2, 4, 8, 16), (2, 4)):
        if time.time() - start > TILES_BUDGET_S:
            break
        tiles = QuantizedTiles(16, block_n, splits, warps, 2)
        us = timed_us(quantized_linear_triton, x, weight, tiles=tiles)
        if best is None or us < best[1]:
            best = (str(tiles), us)
    return best


def best_gemv(x, weight, reference, start: float) -> tuple[tuple, float] | None:
    """(block_n, blocks_per_step, splits, block_m, warps, stages), us."""
    block_m = 1 if x.shape[0] == 1 else 16
    best = None
    configs = itertools.product((4, 8, 16), (8, 16), (1, 2, 4, 8), (4,), (1, 3))
    for block_n, per_step, splits, warps, stages in configs:
        if block_n * per_step * 32 * block_m > 65536 or time.time() - start > GEMV_BUDGET_S:
            continue
        config = (block_n, per_step, splits, block_m, warps, stages)
        y = gemv(x, weight, block_m, block_n, per_step, splits, warps, stages)
        error = (y.float() - reference).abs().max() / reference.abs().max()
        assert error < 2e-2, (config, error.item())
        us = timed_us(gemv, x, weight, block_m, block_n, per_step, splits, warps, stages)
        if best is None or us < best[1]:
            best = (config, us)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the engine's tiles and torch only")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.quantized_linear_sweep needs a CUDA GPU")
    device = torch.device("cuda")
    name = torch.cuda.get_device_name()
    results = {
        "device": name,
        "commit": checkout_commit(),
        "command": " ".join(sys.argv),
        "rows": [],
    }
    start = time.time()
    for (n, k), qtype, m in itertools.product(SHAPES, QTYPES, ROWS):
        weight = timing_weight(qtype, n, k, device)
        x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
        tiles = choose_tiles(device_info(x), m, n, loop_steps(weight))
        row = {"n": n, "k": k, "qtype": qtype, "m": m, "bytes": weight.nbytes}
        row["current"] = {"tiles": str(tiles), "us": timed_us(quantized_linear_triton, x, weight)}
        dense = torch.randn(n, k, dtype=x.dtype, device=device)
        row["torch_us"] = timed_us(torch.nn.functional.linear, x, dense)
        row["best_tiles"] = None if args.quick else best_engine_tiles(x, weight, start)
        if qtype in GEMV_QTYPES and not args.quick:
            reference = x.float() @ weight.dequantize(torch.float32).to(device).T
            row["gemv_best"] = best_gemv(x, weight, reference, start)
        print(json.dumps(row), flush=True)
        results["rows"].append(row)
    path = args.out / f"quantized-linear-sweep-{device_slug(name)}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
