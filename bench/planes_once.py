"""The planes' decode GEMV launched a few times on one of Llama-8B's projections, for a
profiler to take one launch (make gpu-check's last step runs it under Nsight Compute).

    python -m bench.planes_once                        # Q4_0, 14336 x 4096, one row
    python -m bench.planes_once --qtype Q4_K --rows 4
    ncu -k regex:_planes --launch-skip 2 --launch-count 1 --set full python -m bench.planes_once

The launches are the engine's own (``planes_linear_triton`` with the tiles it picks):
the first compiles, so a profiler skips it. The weight is random bytes with small fp16
scales (bench.kernels.timing_weight)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

LAUNCHES = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qtype", default="Q4_0")
    parser.add_argument("--shape", default="14336,4096", help="N,K")
    parser.add_argument("--rows", type=int, default=1)
    args = parser.parse_args(argv)
    import torch
    from hetero_infer.kernels.linear_planes_triton import planes_linear_triton
    from hetero_infer.kernels.quantized_planes import pack_planes

    from bench.kernels import timing_weight

    if not torch.cuda.is_available():
        print("bench.planes_once needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    n, k = (int(v) for v in args.shape.split(","))
    planes = pack_planes(timing_weight(args.qtype, n, k, device))
    x = torch.randn(args.rows, k, dtype=torch.bfloat16, device=device)
    for _ in range(LAUNCHES):
        planes_linear_triton(x, planes)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
