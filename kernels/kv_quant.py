"""How the KV cache stores keys and values (``kv_cache_dtype``), and the torch reference
of its quantization.

- auto: the model's dtype, values as they are.
- int8: each (token, KV head) row of head_dim values is stored as head_dim int8 values
  followed by one fp16 scale per group of 32 values (per row where head_dim is not a
  multiple of 32), in the same row of the cache tensor
  ([num_blocks, block_size, num_kv_heads, head_dim + 2 * groups] int8): per group,

      scale = fp16(max|x| * (1 / 127)),   q = round(x * (127 / max|x|))   (half to even)
      x ~= q * scale

  llama.cpp's q8_0 blocks, 17/16 of a byte per value: a bf16 cache holds 1.88x fewer
  tokens in the same bytes.
- fp8: float8_e4m3fn values with no scale (as vLLM's fp8 without calibrated scales),
  saturated at +-448; CUDA only (the Triton kernels convert it, the CPU ones do not).

Why scales per token and KV head rather than per block: a decode writes one token at a
time into a block that is partly filled, so a block's scale would have to grow as its
tokens arrive, re-rounding the rows already stored, and the writes of one block's tokens
in a prefill chunk would depend on each other. A row's own scales keep every write
independent and exact to one rounding. Why per 32 values rather than one per row: keys
have outlier dims, and one scale for a row of 256 (Gemma 3) left its other values few
steps. Teacher-forced on a fixed text with fp32 activations (where no other rounding
hides the cache's), Gemma-3-270M's top-1 picks agreed with an unrounded cache at 98.4%
with a scale per row and 99.4% per 32 values. The scales sit beside their values so
that a block's copy or swap moves them too, and a kernel reads both from the same cache
lines.

An int8 cache keeps its keys rotated (where head_dim is a multiple of 32): each group of
32 values times the normalized 32x32 Hadamard matrix before it is quantized
(``rotate_groups``). A key's outlier dims are spread over its group, whose scale is then
set by a typical magnitude rather than by the outlier, so the other values keep more
steps. The matrix is orthogonal, so a query rotated alike gives the same scores: the
kernels rotate the query once rather than every key they read, and the torch reference
rotates the keys back (``keys_from_cache``). Values are stored as they are: their
rounding moved the logits a third as much as the keys'. Teacher-forced with fp32
activations on 1,369 tokens of text, SmolLM2's mean change of the text's log-likelihood
per token fell from 0.018 to 0.012 and its flipped top-1 picks from 17 to 8 (values
in groups of 16 instead, at a byte more per 32 values, left 12 flips).
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8")
SCALE_GROUP = 32  # values per int8 scale, where head_dim is a multiple of it
INT8_MAX = 127.0
HADAMARD_NORM = SCALE_GROUP**-0.5  # the rotation's scale, so that it is orthogonal
# Bumped whenever the bytes a given key or value is stored as change (disk tier files
# of another format are never read: engine/kv/fingerprint.py).
KV_FORMAT = 2  # 2: int8 keys rotated
INV_INT8_MAX = 1.0 / 127.0  # the scale is max|x| times this, rounded to fp32, then fp16
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


def scale_group(head_dim: int) -> int:
    """Values per fp16 scale in an int8 row: 32, or the whole row where head_dim is not
    a multiple of 32 (small test models)."""
    return SCALE_GROUP if head_dim % SCALE_GROUP == 0 else head_dim


def scale_bytes(head_dim: int) -> int:
    """Bytes of fp16 scales after an int8 row's head_dim values."""
    return 2 * (head_dim // scale_group(head_dim))


def stored_head_size(head_dim: int, cache_dtype: torch.dtype) -> int:
    """Elements a (token, KV head) row takes in the cache: its values, and its scales
    where the cache is int8."""
    return head_dim + scale_bytes(head_dim) if cache_dtype == torch.int8 else head_dim


def rotates_keys(cache_dtype: torch.dtype, head_dim: int) -> bool:
    """Whether a cache of ``cache_dtype`` keeps keys rotated: int8, in whole groups of 32."""
    return cache_dtype == torch.int8 and head_dim % SCALE_GROUP == 0


def rotate_groups(x: torch.Tensor) -> torch.Tensor:
    """x [..., head_dim] in fp32 with each group of 32 values times the normalized
    32x32 Hadamard matrix (Sylvester's order), which is its own inverse. The butterflies
    and their order are the C++ kernel's, so that both round alike."""
    rows = x.float().reshape(-1, SCALE_GROUP)
    half = 1
    while half < SCALE_GROUP:
        pairs = rows.view(rows.shape[0], -1, 2, half)
        low, high = pairs[:, :, 0], pairs[:, :, 1]
        rows = torch.stack((low + high, low - high), dim=2).view(rows.shape)
        half *= 2
    return (rows * HADAMARD_NORM).view(x.shape)


def keys_to_cache(key: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """New keys [..., head_dim] as the cache stores them (rotated in an int8 cache)."""
    if rotates_keys(cache_dtype, key.shape[-1]):
        key = rotate_groups(key)
    return to_cache(key, cache_dtype)


def keys_from_cache(cache: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Cached key rows as keys in ``dtype``, rotated back where the cache rotates them."""
    if not rotates_keys(cache.dtype, head_dim):
        return from_cache(cache, head_dim, dtype)
    return rotate_groups(from_cache(cache, head_dim, torch.float32)).to(dtype)


def quantize_kv_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., head_dim] (any float dtype) -> int8 rows [..., head_dim + scale_bytes]."""
    head_dim = x.shape[-1]
    groups = x.float().reshape(*x.shape[:-1], -1, scale_group(head_dim))
    amax = groups.abs().amax(-1, keepdim=True)
    # A group of zeros gets scale 0 and values 0 (no division by zero).
    # A tensor divided by a tensor: an IEEE division, as the C++ kernel's (a scalar over
    # a tensor may be taken as the scalar times a reciprocal).
    inv = torch.where(amax > 0, torch.full_like(amax, INT8_MAX) / amax, torch.zeros_like(amax))
    values = torch.round(groups * inv).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    # times the fp32 reciprocal, as every kernel computes it (a division by a scalar is
    # a multiplication in some of torch's kernels and not in others), then to fp16
    scales = (amax * INV_INT8_MAX).half().view(torch.int8)  # [..., groups, 2]: the bytes
    return torch.cat([values.flatten(-2), scales.flatten(-2)], dim=-1)


def dequantize_kv_rows(rows: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """int8 rows [..., head_dim + scale_bytes] -> values [..., head_dim] in ``dtype``."""
    group = scale_group(head_dim)
    scales = rows[..., head_dim:].contiguous().view(torch.float16).float()  # [..., groups]
    values = rows[..., :head_dim].float().reshape(*rows.shape[:-1], -1, group)
    return (values * scales[..., None]).flatten(-2).to(dtype)


def to_cache(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """New keys or values [..., head_dim] as the cache stores them."""
    if cache_dtype == torch.int8:
        return quantize_kv_rows(x)
    if cache_dtype == torch.float8_e4m3fn:
        return x.float().clamp(-FP8_MAX, FP8_MAX).to(cache_dtype)
    return x.to(cache_dtype)


def from_cache(cache: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Cached rows (any part of a cache) of head_dim values as values in ``dtype``."""
    if cache.dtype == torch.int8:
        return dequantize_kv_rows(cache, head_dim, dtype)
    return cache.to(dtype)
