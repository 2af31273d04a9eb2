"""The planes' GEMVs compiled for an H100/H200 (sm90) here, without a GPU, and the
instructions their main loop issues per weight value and lane.

    python -m bench.planes_instructions    # -> bench/results/planes-gemv-instructions.json
    python -m bench.planes_instructions --json out.json

On an H200, Nsight Compute found the byte-wise GEMV (kernels/linear_planes_triton.py)
bound by issuing instructions, not by memory (``H200_PROFILE`` below): a value's
instructions, not its bytes, set its time. Triton's wheel ships ptxas and cuobjdump, so
the SASS of each kernel's loop can be counted on any machine: per type, the byte-wise
GEMV at the tiles it had on the H200 against the word GEMV (kernels/planes_gemv_triton.py)
at the tiles it now runs with and the others bench.planes_linear's sweep tries. The
kernels are compiled as a launch on Llama-8B's shapes specializes them (16-byte
aligned pointers, strides that are multiples of 16); the loop is the longest backward
branch of the SASS. A count per value is the loop's instructions times the lanes that
issue them, over the multiply-adds a turn does (rows x values x activation rows); the
tl.dot kernel's (``dot_rows``, at 16 activation rows) is counted the same way.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import RESULTS_DIR, parse_ints

# Nsight Compute (--set full) on the byte-wise GEMV at one row, Q4_0 14336 x 4096 (58.7M
# values), one launch at its H200 tiles (2 rows a program, 1 warp, 8 steps a turn).
H200_PROFILE = {
    "kernel": "byte-wise GEMV, Q4_0, 14336 x 4096, 1 row",
    "issued_warp_instructions": 15_372_621,
    "lane_instructions_per_value": 15_372_621 * 32 / (14336 * 4096),
    "issue_slots_busy_percent": 66.65,
    "alu_pipe_percent": 60.5,
    "dram_throughput_percent": 23.35,
    "registers_per_thread": 96,
    "duration_us_at_profiler_clocks": 29.98,
}
BYTE_WISE = ("byte-wise", 2, 1, 8)  # (kernel, weight rows, warps, steps a turn)
DOT = ("dot", 64, 4, 1)  # the tl.dot kernel's tiles at 16 rows (choose_planes_tiles)
DOT_ROWS = 16
WORDS = [("words", 8, 4, 1), ("words", 16, 4, 1), ("words", 4, 4, 1), ("words", 8, 4, 2)]
QTYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q5_0", "Q5_1")
DIVISIBLE = {"stride_out_split", "stride_out", "stride_x", "N", "num_blocks", "num_chunks"}


def kernel_and_arguments(kind: str, qtype: str, rows: int, warps: int, unroll: int, m: int):
    """The JIT kernel, its pointer types, constexprs and multiply-adds a loop turn."""
    if kind == "words":
        from hetero_infer.kernels.planes_gemv_triton import _planes_gemv_words_kernel, chunk_values

        from tests.kernels.test_triton_compile import word_pointers

        chunks = 32 * warps * unroll
        constants = dict(QTYPE=qtype, HAS_BIAS=False, BLOCK_M=m, ROWS=rows, CHUNKS=chunks)
        pointers = word_pointers(qtype, "bf16", "bf16")
        return _planes_gemv_words_kernel, pointers, constants, rows * chunks * chunk_values(qtype)
    from hetero_infer.kernels.linear_planes_triton import _planes_dot_kernel, _planes_gemv_kernel

    from tests.kernels.test_triton_compile import planes_constants, planes_pointers

    pointers = planes_pointers(qtype, "bf16", "bf16")
    if kind == "dot":  # a step of 256 values a loop turn
        constants = planes_constants(qtype, m, rows, DOT_FP32=False)
        return _planes_dot_kernel, pointers, constants, rows * 256
    constants = planes_constants(qtype, m, rows, UNROLL=unroll)
    return _planes_gemv_kernel, pointers, constants, rows * 256 * unroll


def compiled_sass(kernel: Any, pointers: dict, constants: dict, warps: int) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, attrs = {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in pointers:
            signature[name] = pointers[name]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif name in constants:
            signature[name] = "constexpr"
        else:
            signature[name] = "i32"
            if name in DIVISIBLE or name.startswith("stride_"):
                attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constants, attrs)
    # The launchers' stages: the word GEMV 1, the byte-wise GEMV 3, the dot kernel 2.
    stages = 1 if "CHUNKS" in constants else (2 if "DOT_FP32" in constants else 3)
    options = dict(num_warps=warps, num_stages=stages)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        return subprocess.run(
            [str(cuobjdump), "-sass", cubin.name], capture_output=True, text=True, check=True
        ).stdout


def main_loop(sass: str) -> collections.Counter:
    """The opcodes of the longest loop: from a backward branch's target to the branch."""
    listing = []
    for line in sass.splitlines():
        match = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if match:
            listing.append((int(match.group(1), 16), match.group(2).split(".")[0], line))
    longest: list[str] = []
    for address, opcode, line in listing:
        target = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", line)
        if opcode == "BRA" and target and int(target.group(1), 16) < address:
            start = int(target.group(1), 16)
            body = [op for at, op, _ in listing if start <= at <= address]
            longest = max(longest, body, key=len)
    return collections.Counter(longest)


def count(kind: str, qtype: str, rows: int, warps: int, unroll: int, m: int) -> dict[str, Any]:
    kernel, pointers, constants, values = kernel_and_arguments(kind, qtype, rows, warps, unroll, m)
    loop = main_loop(compiled_sass(kernel, pointers, constants, warps))
    total = sum(loop.values())
    return {
        "kernel": kind,
        "qtype": qtype,
        "activation_rows": m,
        "weight_rows": rows,
        "warps": warps,
        "unroll": unroll,
        "loop_instructions": total,
        "lane_instructions_per_value": total * warps * 32 / (values * m),
        # each weight value serves every activation row of the tile
        "lane_instructions_per_weight_value": total * warps * 32 / values,
        "top_opcodes": dict(loop.most_common(8)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=str(RESULTS_DIR / "planes-gemv-instructions.json"))
    parser.add_argument("--qtypes", default=",".join(QTYPES))
    parser.add_argument("--activation-rows", default="1,4")
    args = parser.parse_args(argv)
    rows = []
    for qtype in args.qtypes.split(","):
        for m in parse_ints(args.activation_rows):
            for kind, weight_rows, warps, unroll in (BYTE_WISE, *WORDS):
                row = count(kind, qtype, weight_rows, warps, unroll, m)
                rows.append(row)
                print(
                    f"{qtype} M={m} {kind:9s} rows {weight_rows:2d} warps {warps} unroll "
                    f"{unroll}: {row['lane_instructions_per_value']:.2f} a value",
                    flush=True,
                )
    # The tl.dot kernel at 16 rows, per multiply-add (a weight value per activation row).
    dot_rows = [count(*DOT[:1], qtype, *DOT[1:], DOT_ROWS) for qtype in args.qtypes.split(",")]
    for row in dot_rows:
        print(f"{row['qtype']} M={DOT_ROWS} dot: {row['lane_instructions_per_value']:.2f} a MAC")
    import triton

    from bench.throughput import machine_info

    result = {
        "benchmark": "planes_instructions",
        "command": shlex.join(["python", "-m", "bench.planes_instructions", *(argv or [])]),
        "target": "sm90 (H100, H200), compiled here by triton's ptxas",
        "triton": triton.__version__,
        # The CPU that compiled them (the counts are of the sm90 code, the same from
        # any host; the machine, the commit and the library versions, as every result).
        "machine": machine_info(),
        "h200_profile_of_the_byte_wise_gemv": H200_PROFILE,
        "rows": rows,
        "dot_rows": dot_rows,
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
