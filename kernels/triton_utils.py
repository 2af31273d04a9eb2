"""What every Triton launcher needs: tile sizes per device, and the interpreter's limits.

Launch parameters are picked here from the device's properties instead of with
``@triton.autotune``: autotuning fails under the interpreter and would re-benchmark
inside CUDA-graph capture. On CPU tensors Triton can only run in the interpreter
(``TRITON_INTERPRET=1`` set before triton is imported): it is slow per program, not
per element, so there the tiles are as large as possible.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton


@dataclass(frozen=True)
class DeviceInfo:
    interpreter: bool  # CPU tensors: the kernels run in Triton's interpreter
    num_sms: int
    capability: tuple[int, int]

    @property
    def max_tile(self) -> int:
        """Elements per program for row-wise kernels (norm, rope, activation, store)."""
        return 1 << 16 if self.interpreter else 4096


def interpreting() -> bool:
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    # triton < 3.4 has no knobs; it reads the same variable
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _cuda_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(False, props.multi_processor_count, (props.major, props.minor))


def device_info(t: torch.Tensor) -> DeviceInfo:
    if t.is_cuda:
        return _cuda_info(t.device.index if t.device.index is not None else 0)
    if not interpreting():
        raise RuntimeError(
            "Triton kernels on CPU tensors need the interpreter: set TRITON_INTERPRET=1 "
            "before triton is imported (or use the torch backend)"
        )
    return DeviceInfo(True, 1, (0, 0))


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def dot_in_fp32(dtype: torch.dtype, info: DeviceInfo) -> bool:
    """Whether tl.dot runs on fp32 operands (IEEE, no TF32): for fp32 inputs; for bf16 in
    the interpreter, whose bf16 arithmetic is wrong, and before sm80, which has no bf16
    tensor cores. Otherwise 16-bit operands go to the tensor cores as they are,
    accumulating in fp32."""
    if dtype == torch.bfloat16:
        return info.interpreter or info.capability < (8, 0)
    return dtype == torch.float32


def row_warps(block: int) -> int:
    """Warps for a program that reduces over ``block`` elements of one row."""
    if block >= 8192:
        return 16
    if block >= 2048:
        return 8
    return 4


def rows_per_program(num_rows: int, row_elements: int, info: DeviceInfo) -> int:
    """Rows per program for a row-wise kernel: a power of two, tile <= max_tile."""
    fit = max(1, info.max_tile // next_pow2(row_elements))
    return min(next_pow2(num_rows), 1 << (fit.bit_length() - 1))


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    assert t.stride(-1) == 1, f"{name}: the last dimension must be contiguous, strides {t.stride()}"


def split_k_target(out: torch.Tensor, splits: int) -> torch.Tensor:
    """Where a split-K kernel writes: ``out`` itself for one split, else fp32 partial
    sums [splits, *out.shape], one per split, which ``finish_split_k`` adds up."""
    if splits == 1:
        return out
    return torch.empty((splits, *out.shape), dtype=torch.float32, device=out.device)


def finish_split_k(out: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``out`` = the splits' partial sums added up, plus the bias (which programs of a
    split leave out: each would add it once); nothing to do for one split."""
    if target is out:
        return
    summed = target.sum(dim=0)
    if bias is not None:
        summed += bias
    out.copy_(summed)
