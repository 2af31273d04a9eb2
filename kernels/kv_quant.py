"""How the KV cache stores keys and values (``kv_cache_dtype``), and the torch reference
of its quantization.

- auto: the model's dtype, values as they are.
- int8: each (token, KV head) row of head_dim values is stored as head_dim int8 values
  followed by its fp32 scale, in the same row of the cache tensor
  ([num_blocks, block_size, num_kv_heads, head_dim + 4] int8):

      scale = max|x| * (1 / 127),   q = round(x * (127 / max|x|))   (half to even)
      x ~= q * scale

- fp8: float8_e4m3fn values with no scale (as vLLM's fp8 without calibrated scales),
  saturated at +-448; CUDA only (the Triton kernels convert it, the CPU ones do not).

Why a scale per token and KV head rather than per block: a decode writes one token at a
time into a block that is partly filled, so a block's scale would have to grow as its
tokens arrive, re-rounding the rows already stored, and the writes of one block's tokens
in a prefill chunk would depend on each other. A row's own scale keeps every write
independent and exact to one rounding, for 4 bytes a row (6% of a 64-value head). The
scale sits beside its values so that a block's copy or swap moves its scales with it,
and a kernel reads both from the same cache lines.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8")
SCALE_BYTES = 4  # one fp32 scale at the end of each int8 row
INT8_MAX = 127.0
INV_INT8_MAX = 1.0 / 127.0  # the scale is max|x| times this, rounded to fp32
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def kv_cache_torch_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """The cache tensor's dtype for the setting, with the model running in ``dtype``."""
    if kv_cache_dtype == "auto":
        return dtype
    if kv_cache_dtype == "int8":
        return torch.int8
    if kv_cache_dtype == "fp8":
        return torch.float8_e4m3fn
    raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}")


def stored_head_size(head_dim: int, cache_dtype: torch.dtype) -> int:
    """Elements a (token, KV head) row takes in the cache: its values, and its scale
    where the cache is int8."""
    return head_dim + SCALE_BYTES if cache_dtype == torch.int8 else head_dim


def quantize_kv_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., head_dim] (any float dtype) -> int8 rows [..., head_dim + 4]."""
    x = x.float()
    amax = x.abs().amax(-1, keepdim=True)
    # A row of zeros gets scale 0 and values 0 (no division by zero).
    # A tensor divided by a tensor: an IEEE division, as the C++ kernel's (a scalar over
    # a tensor may be taken as the scalar times a reciprocal).
    inv = torch.where(amax > 0, torch.full_like(amax, INT8_MAX) / amax, torch.zeros_like(amax))
    values = torch.round(x * inv).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    # times the fp32 reciprocal, as every kernel computes it (a division by a scalar is
    # a multiplication in some of torch's kernels and not in others)
    scale = (amax * INV_INT8_MAX).view(torch.int8)  # [..., 4]: the fp32 scale's bytes
    return torch.cat([values, scale], dim=-1)


def dequantize_kv_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 rows [..., head_dim + 4] -> values [..., head_dim] in ``dtype``."""
    head_dim = rows.shape[-1] - SCALE_BYTES
    scale = rows[..., head_dim:].contiguous().view(torch.float32)  # [..., 1]
    return (rows[..., :head_dim].float() * scale).to(dtype)


def to_cache(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """New keys or values [..., head_dim] as the cache stores them."""
    if cache_dtype == torch.int8:
        return quantize_kv_rows(x)
    if cache_dtype == torch.float8_e4m3fn:
        return x.float().clamp(-FP8_MAX, FP8_MAX).to(cache_dtype)
    return x.to(cache_dtype)


def from_cache(cache: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cached rows (any part of a cache) as values in ``dtype``."""
    if cache.dtype == torch.int8:
        return dequantize_kv_rows(cache, dtype)
    return cache.to(dtype)
