"""The GPU's linear layers on GGUF weights in planes (kernels/quantized_planes.py,
kernels/linear_planes_triton.py) on Llama-8B's projections, against torch's bf16 matmul
on the dequantized weight, the kernel on the file's blocks, and the memory bound.

    python -m bench.planes_linear                  # needs a CUDA GPU (exits 2 without)
    python -m bench.planes_linear --rows 1,4,16,64 --json out.json
    python -m bench.planes_linear --sweep          # other tiles beside the chosen ones

Per shape (N x K: qkv 6144 x 4096, o 4096 x 4096, gate or up 14336 x 4096, down
4096 x 14336), type (Q4_0, Q4_K, Q8_0) and rows of bf16 activations (1 and 16): the
median time of each, replayed from a CUDA graph as the engine's decode steps are
(copies of the weight in turn, so that each call reads its own from memory; the
planes' kernel also launched call by call), the bytes the planes' kernel must read
(its planes, x and y) over the device's bandwidth (its spec, else a measured copy) as
the bound, and the kernel's largest error against x @ W^T in fp32 on the
dequantized weight, relative to the largest |y|. The weights are random bytes with
small finite fp16 scales (bench.kernels.timing_weight): the time depends on no value.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch
import torch.nn.functional as F
from hetero_infer.kernels.linear_planes_triton import (
    GEMV_MAX_ROWS,
    STEP_VALUES,
    PlanesTiles,
    choose_planes_tiles,
    planes_linear_triton,
)
from hetero_infer.kernels.linear_quantized_triton import quantized_linear_triton
from hetero_infer.kernels.planes_gemv_triton import GEMV_WORD_TYPES
from hetero_infer.kernels.quantized_planes import PlanarWeight, pack_planes
from hetero_infer.kernels.triton_utils import device_info

from bench.common import parse_ints

# (N, K): Llama-3-8B's merged qkv, o, one of gate and up, and down.
SHAPES = ((6144, 4096), (4096, 4096), (14336, 4096), (4096, 14336))
QTYPES = ("Q4_0", "Q4_K", "Q8_0")


def moved_bytes(planes: PlanarWeight, x: torch.Tensor) -> int:
    """The bytes a product must move at least: the planes and x read, y written."""
    (m, k), n = x.shape, planes.shape[0]
    return planes.nbytes + (m * k + m * n) * x.element_size()


def in_turn(fn: Any, x: torch.Tensor, weights: list[Any]) -> float:
    """Milliseconds of fn(x, weight) replayed from a CUDA graph, the weights in turn."""
    from bench import kernels

    return kernels.graph_timed([partial(fn, x, weight) for weight in weights])


def weight_copies(weight: Any, nbytes: int, device: torch.device) -> list[Any]:
    """``weight`` (of ``nbytes``, on ``device``) and copies of it, enough that each call
    reads its own from memory."""
    from bench.kernels import copies_past_cache

    if device.type != "cuda":  # the tests' CPU tensors: the timer is replaced
        return [weight]
    count = copies_past_cache(nbytes, device)
    if isinstance(weight, torch.Tensor):
        return [weight] + [weight.clone() for _ in range(count - 1)]
    if isinstance(weight, PlanarWeight):
        return [weight] + [weight.rows(slice(None)) for _ in range(count - 1)]
    return [weight] + [replace(weight, data=weight.data.clone()) for _ in range(count - 1)]


def bench_case(weight: Any, m: int, dense: torch.Tensor, peak: float) -> dict[str, Any]:
    """One type, shape and row count: the three kernels' times (replayed from a CUDA
    graph, as decode steps run, each call's weight read from memory) and the bound; the
    planes' kernel also launched one call at a time (its time then includes the host's
    launch, as an eager step's does)."""
    from bench import kernels

    n, k = weight.shape
    planes = pack_planes(weight)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=dense.device)
    y = planes_linear_triton(x, planes).float()
    reference = x.float() @ dense.float().T
    error = float((y - reference).abs().max() / reference.abs().max().clamp_min(1e-30))
    nbytes = moved_bytes(planes, x)
    ms = in_turn(planes_linear_triton, x, weight_copies(planes, planes.nbytes, x.device))
    eager_ms = kernels.timed(planes_linear_triton, x, planes)
    file_ms = in_turn(
        quantized_linear_triton, x, weight_copies(weight, weight.data.nbytes, x.device)
    )
    torch_ms = in_turn(F.linear, x, weight_copies(dense, dense.nbytes, x.device))
    bound = nbytes / (peak * 1e3)  # us at peak GB/s
    tiles = choose_planes_tiles(device_info(x), m, n, -(-k // STEP_VALUES), weight.qtype)
    return {
        "qtype": weight.qtype,
        "n": n,
        "k": k,
        "m": m,
        "tiles": str(tiles),
        "planes_us": ms * 1e3,
        "planes_launched_us": eager_ms * 1e3,
        "file_blocks_us": file_ms * 1e3,
        "torch_bf16_us": torch_ms * 1e3,
        "bytes": nbytes,
        "hbm_bound_us": bound,
        "fraction_of_peak": bound / (ms * 1e3),
        "x_torch": torch_ms / ms,
        "x_file_blocks": file_ms / ms,
        "max_relative_error": error,
    }


# The byte-wise GEMV's (weight rows a program, warps, steps a loop turn) the sweep
# tries: a turn reads rows x 128 x steps bytes of Q4_0's values (Q8_0: twice), 16 bytes
# a lane per load. An H200's first sweep found 2 to 4 rows with 4 to 8 steps the
# fastest and no K split faster, so these are around them.
GEMV_CANDIDATES = (
    (2, 1, 8),
    (4, 2, 8),
    (2, 1, 4),
    (4, 1, 8),
    (2, 1, 16),
    (8, 4, 8),
)
# The word GEMV's (weight rows a program, warps, chunks a lane a turn), for the types
# it takes (kernels/planes_gemv_triton.py): more rows share the activations' loads and
# conversions, more warps and chunks put more bytes in flight.
WORDS_CANDIDATES = (
    (8, 4, 1),
    (4, 4, 1),
    (16, 4, 1),
    (8, 2, 1),
    (8, 8, 1),
    (8, 4, 2),
)


def candidate_tiles(
    m: int, qtype: str, chosen: PlanesTiles, dot_chosen: PlanesTiles | None = None
) -> list[PlanesTiles]:
    """The tiles ``--sweep`` tries at ``m`` rows beside the chosen ones: the GEMVs'
    candidates (the word GEMV's for the types it takes, with and without the chosen K
    splits; the byte-wise one's with them) at M <= 4, and the dot kernel's widths
    around ``dot_chosen`` (its tiles at 16 rows: the rows padded to 16, the products
    on tensor cores); else the dot kernel's tile width and warps with the chosen K
    splits, none, and twice as many (each compiled variant costs a second or two; a
    split is only the grid)."""
    if m <= GEMV_MAX_ROWS:
        block_m = chosen.block_m
        splits = sorted({1, chosen.num_splits})
        words = [
            PlanesTiles("words", block_m, n, split, warps, 1, unroll)
            for n, warps, unroll in WORDS_CANDIDATES
            for split in splits
            if qtype in GEMV_WORD_TYPES
        ]
        gemv = [
            PlanesTiles("gemv", block_m, n, chosen.num_splits, warps, 3, unroll)
            for n, warps, unroll in GEMV_CANDIDATES
        ]
        dot = [] if dot_chosen is None else [replace(dot_chosen, block_n=n) for n in (32, 64, 128)]
        return words + gemv + dot
    splits = sorted({1, chosen.num_splits, 2 * chosen.num_splits})
    return [
        PlanesTiles(chosen.kernel, chosen.block_m, n, split, warps, chosen.num_stages)
        for n in (32, 64, 128)
        for warps in (4, 8)
        for split in splits
    ]


def sweep_case(weight: Any, m: int, peak: float) -> dict[str, Any]:
    """Each candidate's time at one type, shape and row count (replayed from a CUDA
    graph, the weight's copies in turn), the fastest against the chosen tiles."""
    n, k = weight.shape
    planes = pack_planes(weight)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=planes.device)
    steps = -(-k // STEP_VALUES)
    chosen = choose_planes_tiles(device_info(x), m, n, steps, weight.qtype)
    dot_chosen = choose_planes_tiles(device_info(x), GEMV_MAX_ROWS + 1, n, steps, weight.qtype)
    copies = weight_copies(planes, planes.nbytes, x.device)
    times = {}
    for tiles in [chosen, *candidate_tiles(m, weight.qtype, chosen, dot_chosen)]:
        if str(tiles) not in times:
            run = partial(planes_linear_triton, tiles=tiles)
            times[str(tiles)] = in_turn(run, x, copies) * 1e3
    best = min(times, key=times.get)
    return {
        "qtype": weight.qtype,
        "n": n,
        "k": k,
        "m": m,
        "chosen": str(chosen),
        "chosen_us": times[str(chosen)],
        "best": best,
        "best_us": times[best],
        "best_fraction_of_peak": moved_bytes(planes, x) / (peak * 1e3) / times[best],
        "us_by_tiles": times,
    }


def sweep(args: argparse.Namespace, device: torch.device, peak: float) -> list[dict[str, Any]]:
    from bench.kernels import timing_weight

    results = []
    # Rows outermost: with 1 first (decode), a step cut off at its limit has timed that
    # for every type.
    for m in args.rows:
        for qtype in args.qtypes:
            for n, k in SHAPES:
                weight = timing_weight(qtype, n, k, device)
                row = sweep_case(weight, m, peak)
                results.append(row)
                print(
                    f"{qtype:<5} {f'{n}x{k}':>12} {m:>3} chosen {row['chosen_us']:7.1f} us, "
                    f"best {row['best_us']:7.1f} us ({row['best_fraction_of_peak']:.0%} of "
                    f"peak): {row['best']}",
                    flush=True,
                )
                if args.json:  # as it goes: a step stopped at its limit keeps what it timed
                    Path(args.json).write_text(json.dumps({"sweep": results}, indent=2) + "\n")
                del weight
                torch.cuda.empty_cache()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=parse_ints, default="1,16", help="rows of x")
    parser.add_argument("--qtypes", type=lambda t: t.split(","), default=",".join(QTYPES))
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--sweep", action="store_true", help="time other tiles beside the chosen ones instead"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "bench.planes_linear times the Triton kernels on an NVIDIA GPU, and none is "
            "available here (torch.cuda.is_available() is False); tests/kernels checks "
            "them on the CPU in Triton's interpreter.",
            file=sys.stderr,
        )
        return 2
    from bench.kernels import peak_bandwidth, timing_weight

    device = torch.device("cuda")
    spec, measured = peak_bandwidth(device)
    peak = spec or measured
    name = torch.cuda.get_device_name(device)
    print(f"{name}: bound at {peak:.0f} GB/s ({'spec' if spec else 'measured copy'})")
    if args.sweep:
        sweep(args, device, peak)
        return 0
    print(
        f"{'type':<5} {'N x K':>12} {'M':>3} {'planes us':>10} {'blocks us':>10} "
        f"{'bf16 us':>8} {'bound us':>9} {'of peak':>8} {'x bf16':>7} {'error':>8}"
    )
    results = []
    for qtype in args.qtypes:
        for n, k in SHAPES:
            weight = timing_weight(qtype, n, k, device)
            dense = weight.dequantize(torch.bfloat16).to(device)  # torch's weight
            for m in args.rows:
                row = bench_case(weight, m, dense, peak)
                results.append(row)
                print(
                    f"{qtype:<5} {f'{n}x{k}':>12} {m:>3} {row['planes_us']:>10.1f} "
                    f"{row['file_blocks_us']:>10.1f} {row['torch_bf16_us']:>8.1f} "
                    f"{row['hbm_bound_us']:>9.1f} {row['fraction_of_peak']:>8.0%} "
                    f"{row['x_torch']:>6.2f}x {row['max_relative_error']:>8.1e}",
                    flush=True,
                )
            del weight, dense
            torch.cuda.empty_cache()
    if args.json:
        result = {"device": name, "peak_gb_per_s": peak, "results": results}
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    # A kernel that computes the wrong product fails the step: its times mean nothing.
    return 1 if any(r["max_relative_error"] > 1e-2 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
