"""Convolutions in full fp32 on a GPU: by default torch lets cuDNN round fp32 inputs to
TF32 (a 10-bit mantissa) on Ampere and later GPUs, about 1e-3 relative where the CPU's
convolution is exact to fp32's rounding. Qwen2.5-VL's patch embedding is a convolution
(kept one: models/qwen2_5_vl_vision.py), and an fp32 model's greedy tokens are to equal
transformers' fp32 ones."""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch


def fp32_convolutions() -> AbstractContextManager:
    """A context in which cuDNN's convolutions compute fp32 in fp32 (its other settings
    as they are)."""
    cudnn = torch.backends.cudnn
    return cudnn.flags(
        enabled=cudnn.enabled,
        benchmark=cudnn.benchmark,
        deterministic=cudnn.deterministic,
        allow_tf32=False,
    )
