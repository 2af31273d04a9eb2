"""Attention within an encoder's segments of one length (a vision tower's tiles): every
token sees every token of its segment, no mask.

The reference is torch's ``scaled_dot_product_attention``, as transformers runs these
towers. On the CPU, fp32 heads of 8 to 32 dims run on the C++ kernel
(csrc/encoder_attention_cpu.cpp, the queries across the lanes): at those sizes torch's
flash kernel spends its time calling tiny matrix products (the tiny Idefics3 tower of
``bench.vision``, 13 tiles x 4 heads of 64 patches, alone: ~160 us a layer against ~60).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F

# The head sizes the C++ kernel is built for, and the multiple a segment's length is of
KERNEL_HEAD_DIMS = (8, 16, 32)
KERNEL_LENGTH_MULTIPLE = 8

EncoderAttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def encoder_attention_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """q, k, v [segments, heads, length, head_dim] -> softmax(q k^T scale) v as
    [segments, length, heads, head_dim] (a view)."""
    return F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(1, 2)


def cpu_encoder_attention(module: ModuleType) -> EncoderAttentionFn:
    """encoder_attention_ref's contract, on the C++ kernel where it takes the step's
    tensors (its result contiguous)."""
    if not module.encoder_attention_available():
        return encoder_attention_ref

    def encoder_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor:
        if kernel_takes(q, k, v):
            return module.encoder_attention(q, k, v, scale)
        return encoder_attention_ref(q, k, v, scale)

    return encoder_attention


def kernel_takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """fp32 heads of a size it is built for, segments of a multiple of 8 tokens, each
    row's values contiguous and the keys' and values' rows equally apart."""
    return (
        q.dtype == k.dtype == v.dtype == torch.float32
        and q.shape[-1] in KERNEL_HEAD_DIMS
        and q.shape[-2] % KERNEL_LENGTH_MULTIPLE == 0
        and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        and k.stride(-2) == v.stride(-2)
    )
