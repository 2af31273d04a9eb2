"""Kernels the model calls, each with a torch implementation that runs anywhere.

The model imports these names only, so a faster implementation for a device
(e.g. Triton on CUDA) can be dispatched here without touching model code.
"""

from kernels.activation import silu_and_mul_ref as silu_and_mul
from kernels.paged_attention import (
    AttentionMetadata,
)
from kernels.paged_attention import (
    paged_attention_ref as paged_attention,
)
from kernels.paged_attention import (
    prepare_torch_attention as prepare_attention,
)
from kernels.paged_attention import (
    store_kv_ref as store_kv,
)
from kernels.rms_norm import fused_add_rms_norm_ref as fused_add_rms_norm
from kernels.rms_norm import rms_norm_ref as rms_norm
from kernels.rotary import rope_cos_sin, rope_inv_freq
from kernels.rotary import rotary_ref as rotary

__all__ = [
    "AttentionMetadata",
    "fused_add_rms_norm",
    "paged_attention",
    "prepare_attention",
    "rms_norm",
    "rope_cos_sin",
    "rope_inv_freq",
    "rotary",
    "silu_and_mul",
    "store_kv",
]
