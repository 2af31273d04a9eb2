"""The GPU's linear layers on GGUF weights in planes (kernels/quantized_planes.py,
kernels/linear_planes_triton.py) on Llama-8B's projections, against torch's bf16 matmul
on the dequantized weight, the kernel on the file's blocks, and the memory bound.

    python -m bench.planes_linear                  # needs a CUDA GPU (exits 2 without)
    python -m bench.planes_linear --rows 1,4,16,64 --json out.json
    python -m bench.planes_linear --sweep          # other tiles beside the chosen ones

Per shape (N x K: qkv 6144 x 4096, o 4096 x 4096, gate or up 14336 x 4096, down
4096 x 14336), type (Q4_0, Q4_K, Q8_0) and rows of bf16 activations (1 and 16): the
median time of each (triton.testing.do_bench, L2 flushed), the bytes the planes' kernel
must read (its planes, x and y) over the device's bandwidth (its spec, else a measured
copy) as the bound, and the kernel's largest error against x @ W^T in fp32 on the
dequantized weight, relative to the largest |y|. The weights are random bytes with
small finite fp16 scales (bench.kernels.timing_weight): the time depends on no value.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch
import torch.nn.functional as F
import triton.testing
from hetero_infer.kernels.linear_planes_triton import (
    GEMV_MAX_ROWS,
    STEP_VALUES,
    PlanesTiles,
    choose_planes_tiles,
    planes_linear_triton,
)
from hetero_infer.kernels.linear_quantized_triton import quantized_linear_triton
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


def bench_case(weight: Any, m: int, dense: torch.Tensor, peak: float) -> dict[str, Any]:
    """One type, shape and row count: the three kernels' times and the bound."""
    from bench.kernels import timed

    n, k = weight.shape
    planes = pack_planes(weight)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=dense.device)
    y = planes_linear_triton(x, planes).float()
    reference = x.float() @ dense.float().T
    error = float((y - reference).abs().max() / reference.abs().max().clamp_min(1e-30))
    ms = timed(planes_linear_triton, x, planes)
    file_ms = timed(quantized_linear_triton, x, weight)
    torch_ms = timed(F.linear, x, dense)
    nbytes = moved_bytes(planes, x)
    bound = nbytes / (peak * 1e3)  # us at peak GB/s
    tiles = choose_planes_tiles(device_info(x), m, n, -(-k // STEP_VALUES))
    return {
        "qtype": weight.qtype,
        "n": n,
        "k": k,
        "m": m,
        "tiles": str(tiles),
        "planes_us": ms * 1e3,
        "file_blocks_us": file_ms * 1e3,
        "torch_bf16_us": torch_ms * 1e3,
        "bytes": nbytes,
        "hbm_bound_us": bound,
        "fraction_of_peak": bound / (ms * 1e3),
        "x_torch": torch_ms / ms,
        "x_file_blocks": file_ms / ms,
        "max_relative_error": error,
    }


def candidate_tiles(m: int, chosen: PlanesTiles) -> list[PlanesTiles]:
    """The tiles ``--sweep`` tries at ``m`` rows beside the chosen ones: the GEMV's
    weight rows a program, warps and steps a loop turn (M <= 4), else the dot kernel's
    tile width and warps (each compiled variant costs a second or two); each with the
    chosen K splits, none, and twice as many."""
    if m <= GEMV_MAX_ROWS:
        # Warps up to the steps a turn: a turn's tile of 4 weight rows is 512 bytes a step,
        # one 16-byte load for each lane of a warp.
        turns = [(1, 1), (1, 2), (2, 2), (1, 4), (2, 4), (4, 4)]
        shapes = [(n, w, 3, u) for n in (4, 8) for w, u in turns]
    else:
        shapes = [(n, w, 3, 1) for n in (32, 64, 128) for w in (4, 8)]
    splits = sorted({1, chosen.num_splits, 2 * chosen.num_splits})
    return [
        PlanesTiles(chosen.kernel, chosen.block_m, n, split, warps, stages, unroll)
        for n, warps, stages, unroll in shapes
        for split in splits
    ]


def sweep_case(weight: Any, m: int, peak: float) -> dict[str, Any]:
    """Each candidate's time at one type, shape and row count (short do_bench runs), the
    fastest against the chosen tiles."""
    n, k = weight.shape
    planes = pack_planes(weight)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=planes.device)
    chosen = choose_planes_tiles(device_info(x), m, n, -(-k // STEP_VALUES))
    times = {}
    for tiles in [chosen, *candidate_tiles(m, chosen)]:
        if str(tiles) not in times:
            run = lambda t=tiles: planes_linear_triton(x, planes, tiles=t)  # noqa: E731
            times[str(tiles)] = triton.testing.do_bench(run, warmup=5, rep=20) * 1e3
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
